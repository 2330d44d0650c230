"""The two-line change from LocalBackend to a Ray cluster (nothing starts until register)."""

from art.backends.ray import RayBackend, RayConfig

backend = RayBackend(config=RayConfig(address="auto", replicas=4, trainer_workers=2))
