"""The service layer: what Limiter Admin does, with no transport in it.

One module per capability: `decisions` (decide, batches, reservations), `leases` (the lease
tickets callers hold, and releasing them), `inspection` (a key's live buckets), `usage` (who
is throttled, a tenant's traffic), `whatif` (replays under a draft, on a bounded pool),
`tenant_limits` (a quick raise, a reset of buckets), `rls` (Envoy's rate limit
protocol mapped onto our levels), `forward_auth` (its header contract), `auth` (who a caller
is), `health`, `recording` (what every decision leaves behind), and `inputs` (reading what
callers ask).

The REST API (policies/api/), the gRPC service (policies/rls_service.py), the console
(limiter_admin/), the admin and the management commands call these. None of them imports
another transport. Errors are the engine's (core.errors), the policy's
(policies.invariants) and this layer's own (`errors`); each transport turns them into its
answer in one place. docs/ARCHITECTURE.md draws the layers.
"""
