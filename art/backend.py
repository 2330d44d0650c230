"""ART's `art.backend` import path: the `Backend` protocol and ART's model type aliases.

A backend that is not one of ours but speaks ART's private methods (`_get_step`,
`_prepare_backend_for_training`, `_train_model`, ...) is driven through
`art.core.protocol_backend` when a model registers with it.
"""

from typing import TypeAlias

from .core.backend import Backend, InferenceEndpoint
from .core.model import Model, TrainableModel

# ART's aliases for backend method signatures: a model of any config (and state) type.
AnyModel: TypeAlias = Model
AnyTrainableModel: TypeAlias = TrainableModel

__all__ = ["AnyModel", "AnyTrainableModel", "Backend", "InferenceEndpoint"]
