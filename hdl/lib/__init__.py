"""Building blocks shared by the MAC unit and the LAD tile: VPU, SFM, SRAM bank, arithmetic."""
