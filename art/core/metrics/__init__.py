"""Metrics: the catalogue of names, a batch's metrics, the builder that accumulates them
between history rows, and the costs of API calls.

Imports only the data model (`art.core.data`).
"""
