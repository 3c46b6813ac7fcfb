"""pytest entry points and cocotb testbenches (run under Verilator through cocotb's runner)."""
