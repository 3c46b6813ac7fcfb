"""Amaranth HDL of ladmac: shared building blocks (hdl/lib) and the two accelerator
blocks (hdl/mac, hdl/lad). Every component is sized by a config object from golden/."""
