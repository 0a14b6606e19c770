"""Keras peer for mgtrain's benchmarks: the seed models in Keras 3 on TensorFlow, trained the way
TensorFlow's "Distributed training with Keras" guide writes it, so that mgtrain can be timed
against it in one run on one machine.

    python3 keras_peer.py --model mlp --batch-size 256 --max-steps 620 --warmup 20 --data synthetic
    python3 keras_peer.py --model convnet --strategy none --epochs 2
    python3 keras_peer.py --model convnet --count-params

As the guide: a tf.distribute.MirroredStrategy, the model built and compiled in its scope(), and
model.fit on a tf.data pipeline, from_tensor_slices -> map(scale) -> cache() -> shuffle() ->
batch(global batch) -> prefetch(AUTOTUNE). The MLP is the guide's task (Dense 256 relu, Dense
256 relu, Dense 10 logits, Adam); the ConvNet is create_model() of the MNIST multi-GPU notebook
that examples/convnet.cfg comes from, written with the same layers and RMSprop (Keras'
defaults), the loss as sparse categorical cross-entropy on the labels (the notebook's one-hot
categorical cross-entropy, without the one-hot copy). --strategy none is the same model fitted
without a strategy (Keras' plain model.fit).

MirroredStrategy mirrors a model over the GPUs of one machine; on a CPU it has one replica, the
CPU, so this peer runs one process (--world has no meaning here: a multi-process CPU run would
be MultiWorkerMirroredStrategy, which bench/peer does not run). TensorFlow uses its default
thread pools (intra-op threads: the cores).

Prints one JSON line: the versions, model, strategy and its replicas, global batch, trainable
parameters, steps, samples/s of the steps after --warmup (on the host's clock, from a callback at
each batch's end), and the test accuracy (real data only). --count-params builds the model,
prints {"params": N} (its trainable parameters) and trains nothing.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import read_idx  # noqa: E402  (standard library only, wherever bench/ is)

# No GPU for this peer (a CUDA build of TensorFlow otherwise probes the driver and logs why
# there is none), and TensorFlow's start-up chatter off: the JSON line is what is read.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def load(data, n_synth=60000):
    """uint8 images (N, 28, 28, 1) and int labels, as tensorflow_datasets gives MNIST; synthetic:
    random pixels and labels, drawn once (the data's content does not change the speed)."""
    if data == "synthetic":
        rng = np.random.default_rng(0)
        return (rng.integers(0, 256, (n_synth, 28, 28, 1), dtype=np.uint8),
                rng.integers(0, 10, n_synth).astype(np.int64), None, None)

    def find(stem):
        for suffix in ("", ".gz"):
            if os.path.exists(os.path.join(data, stem + suffix)):
                return os.path.join(data, stem + suffix)
        raise SystemExit(f"keras_peer: no {stem}[.gz] in {data}")

    xt = read_idx(find("train-images-idx3-ubyte"))[..., None]
    yt = read_idx(find("train-labels-idx1-ubyte")).astype(np.int64)
    xv = read_idx(find("t10k-images-idx3-ubyte"))[..., None]
    yv = read_idx(find("t10k-labels-idx1-ubyte")).astype(np.int64)
    return xt, yt, xv, yv


def build(keras, model):
    """The model, built and compiled (inside the strategy's scope when there is one)."""
    L = keras.layers
    if model == "mlp":
        net = keras.Sequential([L.Input((28, 28, 1)), L.Flatten(), L.Dense(256, "relu"),
                                L.Dense(256, "relu"), L.Dense(10)])
        net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"])
        return net
    net = keras.Sequential([
        L.Input((28, 28, 1)), L.Conv2D(32, (3, 3), activation="relu"),
        L.Conv2D(256, (3, 3), activation="relu"), L.BatchNormalization(),
        L.Conv2D(128, (3, 3), activation="relu"), L.MaxPooling2D((2, 2)), L.Dropout(0.25),
        L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
        L.Dense(10, activation="softmax")])
    net.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.RMSprop(),
                metrics=["accuracy"])
    return net


def trainable(net):
    """Trainable parameters, as mgtrain summary counts them (BatchNorm's moving statistics are
    Keras' non-trainable weights)."""
    return int(sum(np.prod(w.shape) for w in net.trainable_weights))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "convnet"], default="mlp")
    p.add_argument("--strategy", choices=["mirrored", "none"], default="mirrored")
    p.add_argument("--world", type=int, default=1, help="1 only (see the top of the file)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0,
                   help="train this many steps (the data repeated) instead of --epochs")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="folder of IDX files, or 'synthetic'")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--count-params", action="store_true",
                   help="print the model's trainable parameters as JSON and train nothing")
    a = p.parse_args()
    if a.world != 1:
        p.error(f"--world {a.world}: MirroredStrategy on a CPU has one replica; this peer runs "
                "one process")
    if a.batch_size < 1 or a.epochs < 1 or a.max_steps < 0 or a.warmup < 0:
        p.error("--batch-size and --epochs must be positive, --max-steps and --warmup not "
                "negative")

    import tensorflow as tf
    import keras

    if a.count_params:
        print(json.dumps({"model": a.model, "params": trainable(build(keras, a.model))}),
              flush=True)
        return
    keras.utils.set_random_seed(a.seed)
    xt, yt, xv, yv = load(a.data)

    def scale(image, label):  # the guide's map()
        return tf.cast(image, tf.float32) / 255.0, label

    train = (tf.data.Dataset.from_tensor_slices((xt, yt)).map(scale).cache()
             .shuffle(len(xt), seed=a.seed))
    if a.max_steps:  # passes over the data joined, so every batch is full
        train = train.repeat()
    train = train.batch(a.batch_size).prefetch(tf.data.AUTOTUNE)

    strategy = tf.distribute.MirroredStrategy() if a.strategy == "mirrored" else None
    if strategy:
        with strategy.scope():
            net = build(keras, a.model)
    else:
        net = build(keras, a.model)

    # The timed steps: from the end of step `warmup` to the end of the last, on the host's clock
    # (Keras calls the callback after each step's results are in); samples counted per batch,
    # an epoch's last batch being short.
    per_epoch = -(-len(xt) // a.batch_size)
    last = len(xt) - (per_epoch - 1) * a.batch_size

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps, self.seen, self.t0, self.t1, self.batch = 0, 0, None, None, 0

        def on_train_batch_begin(self, batch, logs=None):
            self.batch = batch

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == a.warmup:
                self.t0 = time.perf_counter()
            elif self.steps > a.warmup:
                full = a.max_steps or (self.batch + 1) % per_epoch
                self.seen += a.batch_size if full else last
                self.t1 = time.perf_counter()

    clock = Clock()
    if a.warmup == 0:
        clock.t0 = time.perf_counter()
    if a.max_steps:
        net.fit(train, epochs=1, steps_per_epoch=a.max_steps, callbacks=[clock], verbose=0)
    else:
        net.fit(train, epochs=a.epochs, callbacks=[clock], verbose=0)
    acc = None
    if xv is not None:
        _, acc = net.evaluate(xv.astype(np.float32) / 255.0, yv, batch_size=1000, verbose=0)
    dt = (clock.t1 - clock.t0) if clock.t0 is not None and clock.t1 is not None else 0.0
    print(json.dumps({
        "peer": "keras", "tensorflow": tf.__version__, "keras": keras.__version__,
        "device": "cpu", "model": a.model, "strategy": a.strategy,
        "replicas": strategy.num_replicas_in_sync if strategy else 1, "world": 1,
        "global_batch": a.batch_size, "params": trainable(net), "steps": clock.steps,
        "samples_per_s": float(f"{clock.seen / dt:.4g}") if dt > 0 else None,
        "test_acc": float(acc) if acc is not None else None,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}),
        flush=True)


if __name__ == "__main__":
    sys.exit(main())
