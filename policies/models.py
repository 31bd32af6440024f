"""Policy models (tiers, tenants, rules, levels, priorities) arrive with the policy store."""
