"""python -m jensenkv.llm [key=value ...]: the LLM partial-prefill experiment (configs/llm/, jensenkv.llm.config).

Exit codes: 0 every run finished; 1 some run is being run by another process; 2 bad input (one line naming the key,
the value and what is allowed, before any model loads); 130 interrupted (the measured windows are kept: a rerun
resumes).
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "llm"
USAGE = __doc__


def compose(overrides: list[str]):
    """The typed config for ``overrides`` (Hydra's compose API, onto ``llm_schema``)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    from jensenkv.llm.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    return OmegaConf.to_object(cfg)


def _one_line(error: Exception) -> str:
    from jensenkv.spec import field_error_line

    text = str(error).split("Config search path:")[0]
    cause = error.__cause__
    if isinstance(cause, ValueError) and "full_key" not in str(cause):
        return str(cause)
    if cause is not None and "full_key:" in str(cause):
        return field_error_line(cause)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGINT, lambda *_: (print("interrupted: measured windows are kept; rerun to resume",
                                                   file=sys.stderr), sys.exit(130)))
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jensenkv.llm.text import MissingTextError
    from jensenkv.llm.weights import MissingLlmWeightsError

    try:
        cfg = compose(args)
        from jensenkv.llm.experiment import describe, run_experiment

        summary = run_experiment(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except (MissingLlmWeightsError, MissingTextError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(describe(summary))
    sys.exit(1 if summary["held_elsewhere"] else 0)


if __name__ == "__main__":
    main()
