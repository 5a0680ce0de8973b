"""Trace-file parsers, one format each: Azure (CSV), Mooncake and plain JSON lines."""
