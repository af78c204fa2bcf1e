"""``python -m jensenkv.run --help`` lists every field of the config tree with its value and its one-line doc."""
from __future__ import annotations

from jensenkv.config.tree import RunConfig
from jensenkv.config.help import register_help_resolver, schema_fields


def test_every_field_has_a_one_line_doc():
    rows = schema_fields(RunConfig)
    undocumented = [key for key, doc in rows if not doc]
    assert not undocumented, f"fields without a comment beside them or a docstring line: {undocumented}"
    assert len(rows) > 100 and all("\n" not in doc and len(doc) <= 110 for _, doc in rows)
    docs = dict(rows)
    assert docs["cache.sink_chunks"] == "first n chunks stay full precision and always visible"  # the comment
    assert docs["attention.backend"].startswith("a kernel of jensenkv.attention.ATTENTION_BACKENDS")  # docstring
    assert docs["generation.worldplay.fov_seed"].startswith("the retrieval's Monte-Carlo view overlap")  # fov_*


def test_help_template_shows_the_composed_values_and_the_docs():
    from jensenkv.config.resolve import compose_config

    register_help_resolver()
    template = compose_config(["model=magi1_tiny", "quant.bits=4"], hydra_config=True).hydra.help.template
    assert "  quant.bits = 4  # integer width of the codes: 2, 3, 4 or 8" in template
    assert "  model.preset = tiny  # tiny | 4.5B | 4.5B_distill | 24B | 24B_distill" in template  # MAGI-1's words
    assert "$APP_CONFIG_GROUPS" in template
