"""The run's configuration: the typed tree (``tree``: RunConfig and the nodes it composes), the resolve step
(``resolve``: compose, build, read the files a run depends on -> RunSpec and its id), ``--help`` (``help``), the
W&B node (``logger``) and the LLM experiment's tree (``llm``).

This namespace exports the tree only: ``import jensenkv.config`` loads no pandas and reads no file."""
from jensenkv.config.tree import PathsConfig, RunConfig, register_configs

__all__ = ["PathsConfig", "RunConfig", "register_configs"]
