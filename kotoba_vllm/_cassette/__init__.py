"""Cassette machinery: expectations read from raw answers, drift tables, replay through respx, the recorder.

The data model and file I/O are public in `kotoba_vllm.cassettes`."""
