"""One typed configuration: YAML -> dataclasses (sections model, nsa, data, train, run, mesh, exec).

``model`` and ``nsa`` say what the model is (they fix the parameter shapes); ``exec`` says how to
run it (implementations, rematerialisation, kernel algorithm choices), which may change between
a run and its resume. A section may nest another (``exec.kernel``, ``data.retrieval``): overrides
take dotted paths of any depth (``train.steps=100``, ``exec.kernel.sel_impl=tiled``,
``data.retrieval.pairs=48``) and YAML nested mappings.

``load_config(path, overrides)`` reads a YAML file (a key given twice in one mapping is an
error), applies the overrides, rejects unknown keys (naming the full dotted key) and wrong types,
and validates every section before any compute. Every problem raises :class:`ConfigError` with
one line naming the key. Keys that moved (:data:`MOVED`) still load, with one note naming the
new key; :func:`config_warnings` lists settings that are valid but probably not meant.

Two modules: :mod:`.schema` (the sections and their checks) and :mod:`.loading` (YAML,
overrides, moved keys, and the way back out); this package is their public surface.
"""
from nsa_jax.config.loading import (MOVED, apply_overrides, config_from_dict, describe_keys,
                                    load_config, migrate, parse_override, save_config,
                                    yaml_value)
from nsa_jax.config.schema import (DATA_STREAM_KEYS, PACKED_SOURCES, SECTIONS, SHAPE_SECTIONS,
                                   Config, ConfigError, DataConfig, ExecConfig, MeshConfig,
                                   ModelConfig, RetrievalConfig, RunConfig, TrainConfig,
                                   config_warnings)

__all__ = ["DATA_STREAM_KEYS", "MOVED", "PACKED_SOURCES", "SECTIONS", "SHAPE_SECTIONS", "Config",
           "ConfigError", "DataConfig", "ExecConfig", "MeshConfig", "ModelConfig", "RetrievalConfig",
           "RunConfig", "TrainConfig", "apply_overrides", "config_from_dict", "config_warnings",
           "describe_keys", "load_config", "migrate", "parse_override", "save_config",
           "yaml_value"]
