"""Switchyard's load generator: trace readers, and (with the live stack) replay."""
