"""Sending requests: the one per-request path (`sender.py`), the session its callers share (`session.py`), the
shard loop (`worker.py`), the journal that makes each answer durable before its slot is freed, and a
conversation's turns."""
