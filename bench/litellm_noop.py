"""A LiteLLM callback that does nothing, for bench/litellm.py: what LiteLLM's proxy spends on a
call once any callback is configured. Imported only by the proxy, in its own environment."""

from litellm.integrations.custom_logger import CustomLogger


class Noop(CustomLogger):
    pass


noop = Noop()
