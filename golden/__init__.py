"""PyTorch golden model of ladmac: configs and number formats (the spec), float
reference algorithms, and bit-accurate integer models of every RTL block.

golden never imports hdl: the RTL is built *from* these configs and tables.
"""
