"""Calibration of the draft's confidence head: the scores and Sequential Temperature Scaling
(`metrics`), the fit on decoded prompts written into a draft (`fit`) and its report
(`report`). Below both the end-of-training fit (`dspark.training`) and the benchmark's
(`dspark.eval`), which only gather the prompts."""
