"""Capture: the scopes a rollout runs in, HTTP exchanges recorded and re-assembled from
their streams, and the SDK and httpx hooks that record them.

Imports only the data model (`art.core.data`).
"""
