"""The serving engines dspark drives as processes users run (llama.cpp's server): started,
asked over HTTP, closed. Regeneration and the benchmarks both use them."""
