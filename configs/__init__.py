"""TOML presets shipped with vidgen (installed as ``vidgen.configs``)."""
