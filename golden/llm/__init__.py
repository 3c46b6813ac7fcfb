"""Real LLMs (SmolLM2-135M-Instruct, all-MiniLM-L6-v2) loaded offline from their PyPI
packages, with LAD, MAC and AttnCache plugged in through transformers' attention
interface, and the end-to-end accuracy evaluations behind ``ladmac eval``."""
