#!/usr/bin/env python3
"""Metric values from scikit-learn for crates/train/tests/metrics.rs.

Writes crates/train/tests/fixtures/metrics.json: random classification scores (6 classes, one
of which never occurs, so averages must skip it as scikit-learn does), binary scores with ties,
regression pairs, and language-model logits, with scikit-learn's (and for perplexity, a float64
log-softmax's) values. Usage: python3 scripts/metric_fixtures.py
"""
import json
import os

import numpy as np
from sklearn import metrics as M

rng = np.random.default_rng(20261123)
N, C = 257, 6
logits = rng.normal(size=(N, C)).astype(np.float32)
logits[:, 5] -= 100.0  # class 5 is never predicted
targets = rng.integers(0, 5, size=N)  # ... and never a target
# Make predictions correlate with targets so scores are not all near chance.
logits[np.arange(N), targets] += 1.0
pred = logits.argmax(1)
probs = np.exp(logits[:, :5] - logits[:, :5].max(1, keepdims=True))
probs /= probs.sum(1, keepdims=True)

out = {"n": N, "classes": C, "logits": logits.ravel().tolist(), "targets": targets.tolist()}
out["accuracy"] = M.accuracy_score(targets, pred)
out["top3_accuracy"] = M.top_k_accuracy_score(targets, logits, k=3, labels=list(range(C)))
out["confusion"] = M.confusion_matrix(targets, pred, labels=list(range(C))).tolist()
for avg in ["micro", "macro", "weighted"]:
    out[f"precision_{avg}"] = M.precision_score(targets, pred, average=avg, zero_division=0)
    out[f"recall_{avg}"] = M.recall_score(targets, pred, average=avg, zero_division=0)
    out[f"f1_{avg}"] = M.f1_score(targets, pred, average=avg, zero_division=0)
    out[f"iou_{avg}"] = M.jaccard_score(targets, pred, average=avg, zero_division=0)
out["probs"] = probs.astype(np.float32).ravel().tolist()
out["auc_ovr_macro"] = M.roc_auc_score(targets, probs.astype(np.float32).astype(np.float64), multi_class="ovr", average="macro")

# Binary scores rounded to one decimal: many ties.
yb = rng.integers(0, 2, size=N)
sb = np.round(np.clip(rng.normal(0.5 + 0.2 * (yb - 0.5), 0.25), 0, 1), 1).astype(np.float32)
out["binary_scores"] = sb.tolist()
out["binary_targets"] = yb.tolist()
out["auc_binary"] = M.roc_auc_score(yb, sb.astype(np.float64))

yr = rng.normal(3.0, 2.0, size=(N, 2)).astype(np.float32)
pr = (yr + rng.normal(0, 0.7, size=(N, 2))).astype(np.float32)
out["reg_targets"] = yr.ravel().tolist()
out["reg_preds"] = pr.ravel().tolist()
y64, p64 = yr.astype(np.float64).ravel(), pr.astype(np.float64).ravel()
out["mae"] = M.mean_absolute_error(y64, p64)
out["mse"] = M.mean_squared_error(y64, p64)
out["r2"] = M.r2_score(y64, p64)

V, T = 11, 40
lm = rng.normal(size=(T, V)).astype(np.float32)
tok = rng.integers(0, V, size=T)
l64 = lm.astype(np.float64)
lsm = l64 - l64.max(1, keepdims=True)
lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
out["lm_logits"] = lm.ravel().tolist()
out["lm_tokens"] = tok.tolist()
out["lm_vocab"] = V
out["perplexity"] = float(np.exp(-lsm[np.arange(T), tok].mean()))

path = os.path.join(os.path.dirname(__file__), "..", "crates", "train", "tests", "fixtures", "metrics.json")
with open(path, "w") as f:
    json.dump(out, f)
print("wrote", path)
