"""POST /infill: llama.cpp's code-infill endpoint, for the editors that speak it."""
