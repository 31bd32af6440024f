"""Admin registrations for the policy models arrive with the models themselves."""
