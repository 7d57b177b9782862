"""Trace readers: real request traces turned into typed arrivals."""
