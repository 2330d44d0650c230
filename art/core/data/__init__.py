"""The data model, art's bottom layer: trajectories and groups, exchanges and histories,
types, configs (`dev`, train options), errors and the checks on them.

Imports nothing else of `art`; every other layer of `art.core` builds on it.
"""
