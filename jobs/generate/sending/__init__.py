"""Sending requests: building a request, the per-request path and the shard loop, the journal that
makes each answer durable before its slot is freed, and a conversation's turns."""
