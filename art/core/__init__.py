"""The client core: trajectory model, models, gathering, configs, storage and the Backend protocol.

Imports nothing from `art.backends`, `art.ruler`, `art.autorl` or `art.integrations`.
"""
