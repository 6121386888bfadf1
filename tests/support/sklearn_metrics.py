"""scikit-learn's values for the cases tests/unit/sdk_metrics_test.cpp writes.

Input, one case per line: "<name> <kind> <n> <c> <values...>", kind one of
  multiclass  n*c scores, then n labels
  binary      n scores, then n labels (0/1)
  regression  n predictions, then n targets
Output, one line per value: "<name>/<metric> <value>" (repr: exact; nan
where scikit-learn raises, as kiln returns NaN there).
"""
import sys
import warnings

import numpy as np
from sklearn import metrics as m

warnings.simplefilter("ignore")  # zero divisions and undefined metrics: the values are what is compared


def guarded(f):
    try:
        return float(f())
    except ValueError:
        return float("nan")


def one_vs_rest(y, scores):
    """roc_auc_score(multi_class="ovr", average="macro"): the mean of each
    class's binary roc_auc_score, which is what scikit-learn computes once its
    input checks pass. Those checks refuse what kiln accepts (two columns,
    rows that do not sum to 1); where they pass, the two must agree."""
    c = scores.shape[1]
    value = guarded(lambda: np.mean([m.roc_auc_score(y == k, scores[:, k]) for k in range(c)]))
    if c > 2 and np.allclose(scores.sum(1), 1.0):
        direct = guarded(lambda: m.roc_auc_score(y, scores, multi_class="ovr", labels=list(range(c))))
        assert (np.isnan(direct) and np.isnan(value)) or abs(direct - value) <= 1e-12, (direct, value)
    return value


def multiclass(n, c, v):
    scores = np.array(v[: n * c], dtype=np.float64).reshape(n, c)
    y = np.array(v[n * c :], dtype=np.int64)
    labels = list(range(c))
    pred = scores.argmax(1)
    out = {"accuracy": m.accuracy_score(y, pred)}
    # kiln given the predicted labels [N] instead of the scores.
    out["accuracy_of_labels"] = out["accuracy"]
    out["f1_macro_of_labels"] = m.f1_score(y, pred, labels=labels, average="macro")
    if c > 2:
        out["top2"] = guarded(lambda: m.top_k_accuracy_score(y, scores, k=2, labels=labels))
    for average in ("micro", "macro", "weighted"):
        out["precision_" + average] = m.precision_score(y, pred, labels=labels, average=average)
        out["recall_" + average] = m.recall_score(y, pred, labels=labels, average=average)
        out["f1_" + average] = m.f1_score(y, pred, labels=labels, average=average)
    for i, count in enumerate(m.confusion_matrix(y, pred, labels=labels).reshape(-1)):
        out["confusion_%d" % i] = count
    out["auroc"] = one_vs_rest(y, scores)
    out["average_precision"] = guarded(lambda: m.average_precision_score(np.eye(c)[y], scores, average="macro"))
    return out


def binary(n, v):
    scores = np.array(v[:n], dtype=np.float64)
    y = np.array(v[n:], dtype=np.int64)
    pred = (scores > 0.5).astype(np.int64)
    return {
        "auroc": guarded(lambda: m.roc_auc_score(y, scores)),
        "average_precision": guarded(lambda: m.average_precision_score(y, scores)),
        "f1_binary": m.f1_score(y, pred, labels=[0, 1], average="binary"),
        "precision_binary": m.precision_score(y, pred, labels=[0, 1], average="binary"),
        "recall_binary": m.recall_score(y, pred, labels=[0, 1], average="binary"),
    }


def regression(n, v):
    pred = np.array(v[:n], dtype=np.float64)
    y = np.array(v[n:], dtype=np.float64)
    return {
        "mse": guarded(lambda: m.mean_squared_error(y, pred)),
        "mae": guarded(lambda: m.mean_absolute_error(y, pred)),
        "r2": guarded(lambda: m.r2_score(y, pred)),
    }


def main():
    with open(sys.argv[1]) as cases, open(sys.argv[2], "w") as out:
        for line in cases:
            words = line.split()
            if not words:
                continue
            name, kind, n, c = words[0], words[1], int(words[2]), int(words[3])
            values = [float(w) for w in words[4:]]
            if kind == "multiclass":
                result = multiclass(n, c, values)
            elif kind == "binary":
                result = binary(n, values)
            else:
                result = regression(n, values)
            for key, value in result.items():
                out.write("%s/%s %r\n" % (name, key, float(value)))


if __name__ == "__main__":
    main()
