"""cocotb test modules (run inside the simulator; not collected by pytest)."""
