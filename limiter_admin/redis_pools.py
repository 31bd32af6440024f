"""One Redis connection pool per cache alias, not per URL.

django-redis keeps its pools in one process-wide dict keyed by URL alone, so the `default`,
`limiter` and `limiter_batch` aliases, which share REDIS_URL, would all get whichever pool was
made first, timeouts included: the limiter's 50 ms could silently become "wait for ever" (a
dead Redis would hang decisions) or the dashboard's patient reads could get 50 ms. Keying the
pool by its timeouts and pool options too gives each alias its own.
"""

from django_redis.pool import ConnectionFactory


class PoolPerSettingsFactory(ConnectionFactory):
    def get_or_create_connection_pool(self, params):
        key = (
            params["url"],
            params.get("socket_timeout"),
            params.get("socket_connect_timeout"),
            repr(sorted(self.pool_cls_kwargs.items(), key=lambda item: item[0])),
        )
        if key not in self._pools:
            self._pools[key] = self.get_connection_pool(params)
        return self._pools[key]
