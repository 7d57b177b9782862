"""Drive a stack of separate processes on the real Kafka broker and Redis: start and kill
services, replay through it, read its topics, count what was lost or run twice. Shared by
the integration tests and the benchmarks."""
