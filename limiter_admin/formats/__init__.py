"""Date formats of the admin's pages (FORMAT_MODULE_PATH): times as the console shows them,
`2026-12-31 00:00:00 UTC`, with the time zone, not Django's `Dec. 31, 2026, midnight`."""
