"""The REST API, v1: decisions, batches, reservations, buckets, statistics and policy CRUD."""
