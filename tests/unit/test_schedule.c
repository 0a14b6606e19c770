/* test_schedule.c: the learning-rate schedules (src/schedule.c) and the validation history's
 * rules (src/monitor.c: best epoch, early stopping, the plateau cuts), no MPI needed.
 *
 * The rates are checked against values worked out by hand from the formulas of schedule.h at
 * chosen steps (decay boundaries, the middle and end of the cosine, the warm-up's first and last
 * steps). Each expected value is computed in double and the schedule rounds its double once to
 * float, so the two floats are equal, or one float ulp apart where the double computations
 * (in another order here) straddle a rounding boundary: the tolerance is 2^-23 relative.
 *
 * The history's rules are replayed on crafted validation sequences whose verdicts follow from
 * Keras' EarlyStopping and ReduceLROnPlateau step by step (worked out in the comments). The
 * [train] keys are parsed through mgt_train_set, and every bad value or combination must fail
 * with a message naming the key. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "monitor.h"
#include "schedule.h"
#include "train_cfg.h"

#include "tally.h"

static int same_rate(float got, double want) {
    return fabs((double)got - want) <= 0x1p-23 * fabs(want);
}

static mgt_train_cfg train_with(tally *t, const char *const *kv) {
    mgt_train_cfg c;
    mgt_train_defaults(&c);
    c.lr = 1.0f;
    for (int i = 0; kv[i]; i += 2) {
        mgt_err e;
        const int rc = mgt_train_set(&c, kv[i], kv[i + 1], &e);
        CHECK(t, rc == 0);
        if (rc)
            fprintf(stderr, "  %s = %s: %s\n", kv[i], kv[i + 1], e.msg);
    }
    return c;
}

#define TRAIN(T, ...) train_with((T), (const char *const[]){__VA_ARGS__, NULL})

static mgt_sched sched_of(const mgt_train_cfg *c, int64_t spe, int epochs) {
    mgt_sched s;
    mgt_sched_init(&s, &c->sched, c->lr, spe, epochs);
    return s;
}

static void test_rates(tally *t) {
    /* constant: the rate, and lr_min has no say */
    mgt_train_cfg c = TRAIN(t, "lr_min", "5");
    mgt_sched s = sched_of(&c, 10, 3);
    CHECK(t, mgt_sched_lr(&s, 0, 0) == 1.0f && mgt_sched_lr(&s, 29, 0) == 1.0f);

    /* step every 2 epochs of 10 steps, rate 0.5: steps 0-19 at 1, 20-39 at 0.5, 40- at 0.25 */
    c = TRAIN(t, "lr_schedule", "step", "lr_decay_epochs", "2", "lr_decay_rate", "0.5");
    s = sched_of(&c, 10, 6);
    CHECK(t, mgt_sched_lr(&s, 19, 0) == 1.0f && mgt_sched_lr(&s, 20, 0) == 0.5f &&
                 mgt_sched_lr(&s, 39, 0) == 0.5f && mgt_sched_lr(&s, 40, 0) == 0.25f);
    /* at the listed epochs 1 and 3 (MultiStepLR), default rate 0.1, and the lr_min floor */
    c = TRAIN(t, "lr_schedule", "step", "lr_decay_epochs", "1,3", "lr_min", "0.02");
    s = sched_of(&c, 10, 6);
    CHECK(t, mgt_sched_lr(&s, 9, 0) == 1.0f && same_rate(mgt_sched_lr(&s, 10, 0), 0.1) &&
                 same_rate(mgt_sched_lr(&s, 29, 0), 0.1) &&
                 same_rate(mgt_sched_lr(&s, 30, 0), 0.02));
    /* fractional epochs: every 2.5 epochs of 4 steps = every 10 steps */
    c = TRAIN(t, "lr_schedule", "step", "lr_decay_epochs", "2.5", "lr_decay_rate", "0.5");
    s = sched_of(&c, 4, 10);
    CHECK(t, mgt_sched_lr(&s, 9, 0) == 1.0f && mgt_sched_lr(&s, 10, 0) == 0.5f);

    /* exponential, rate 0.25 per 2 epochs of 10 steps: step 10 is half a period: 0.25^0.5 */
    c = TRAIN(t, "lr_schedule", "exponential", "lr_decay_epochs", "2", "lr_decay_rate", "0.25");
    s = sched_of(&c, 10, 6);
    CHECK(t, mgt_sched_lr(&s, 0, 0) == 1.0f && same_rate(mgt_sched_lr(&s, 10, 0), 0.5) &&
                 same_rate(mgt_sched_lr(&s, 40, 0), 0.0625) &&
                 same_rate(mgt_sched_lr(&s, 3, 0), pow(0.25, 3.0 / 20.0)));

    /* cosine over 3 epochs of 10 steps after a 10-step warm-up: D = 20 steps from step 10, from
     * 1 down to lr_min 0.1. Warm-up: step i takes (i + 1) / 10 of the rate (1 during it). */
    c = TRAIN(t, "lr_schedule", "cosine", "lr_min", "0.1", "warmup_steps", "10");
    s = sched_of(&c, 10, 3);
    CHECK(t, same_rate(mgt_sched_lr(&s, 0, 0), 0.1) && same_rate(mgt_sched_lr(&s, 4, 0), 0.5) &&
                 mgt_sched_lr(&s, 9, 0) == 1.0f && mgt_sched_lr(&s, 10, 0) == 1.0f);
    CHECK(t, same_rate(mgt_sched_lr(&s, 20, 0), 0.55) && /* halfway: (1 + 0.1) / 2 */
                 same_rate(mgt_sched_lr(&s, 25, 0), 0.1 + 0.45 * (1 - sqrt(0.5))) &&
                 same_rate(mgt_sched_lr(&s, 30, 0), 0.1) && /* the end, and after it */
                 same_rate(mgt_sched_lr(&s, 45, 0), 0.1));
    /* warm-up by epochs: 0.5 epoch of 10 steps = 5 steps; cosine over lr_decay_epochs = 1 */
    c = TRAIN(t, "lr_schedule", "cosine", "warmup_epochs", "0.5", "lr_decay_epochs", "1");
    s = sched_of(&c, 10, 8);
    CHECK(t, same_rate(mgt_sched_lr(&s, 0, 0), 0.2) && mgt_sched_lr(&s, 4, 0) == 1.0f &&
                 same_rate(mgt_sched_lr(&s, 10, 0), 0.5) && mgt_sched_lr(&s, 15, 0) == 0.0f);
    /* warm-up on a constant rate */
    c = TRAIN(t, "warmup_steps", "4");
    s = sched_of(&c, 10, 3);
    CHECK(t, mgt_sched_lr(&s, 0, 0) == 0.25f && mgt_sched_lr(&s, 2, 0) == 0.75f &&
                 mgt_sched_lr(&s, 3, 0) == 1.0f && mgt_sched_lr(&s, 100, 0) == 1.0f);
    /* a warm-up as long as training: the cosine has one step left, after which it is lr_min */
    c = TRAIN(t, "lr_schedule", "cosine", "warmup_steps", "30", "lr_min", "0.25");
    s = sched_of(&c, 10, 3);
    CHECK(t, same_rate(mgt_sched_lr(&s, 29, 0), 1.0) && same_rate(mgt_sched_lr(&s, 31, 0), 0.25));

    /* plateau: factor^cuts, floored at lr_min; no further cut once the floor is reached */
    c = TRAIN(t, "lr_schedule", "plateau", "lr_plateau_factor", "0.1", "lr_min", "0.005");
    s = sched_of(&c, 10, 3);
    CHECK(t, mgt_sched_lr(&s, 7, 0) == 1.0f && same_rate(mgt_sched_lr(&s, 7, 2), 0.01) &&
                 same_rate(mgt_sched_lr(&s, 7, 3), 0.005));
    CHECK(t, mgt_sched_can_cut(&s, 2) && !mgt_sched_can_cut(&s, 3));
}

/* The verdicts of a sequence of validations. */
typedef struct {
    double loss, acc;
    int improved, cut, stop;
} epoch_case;

static void replay(tally *t, const char *what, const mgt_train_cfg *c, const epoch_case *e, int n) {
    mgt_sched s = sched_of(c, 10, n);
    mgt_monitor_state st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < n; i++) {
        const mgt_monitor_verdict v =
            mgt_monitor_decide(&c->stop, &s, &st, i + 1, e[i].loss, e[i].acc);
        const int ok = v.improved == e[i].improved && v.cut == e[i].cut && v.stop == e[i].stop;
        CHECK(t, ok);
        if (!ok)
            fprintf(stderr, "  %s, epoch %d: improved %d cut %d stop %d, expected %d %d %d\n", what,
                    i + 1, v.improved, v.cut, v.stop, e[i].improved, e[i].cut, e[i].stop);
        /* the state goes through the checkpoint's text and comes back the same */
        char text[256];
        mgt_monitor_format(&st, text, sizeof text);
        mgt_monitor_state back;
        mgt_err err;
        CHECK(t, mgt_monitor_parse(text, &back, &err) == 0 && !memcmp(&back, &st, sizeof st));
    }
}

static void test_history(tally *t) {
    /* EarlyStopping(patience=2) on val_loss: epochs 1, 2 improve; 3 and 4 do not (0.85, 0.8 is
     * not below the best 0.8): wait reaches 2 at epoch 4, which stops. */
    mgt_train_cfg c = TRAIN(t, "early_stop_patience", "2");
    const epoch_case a[] = {
        {1.0, 0, 1, 0, 0}, {0.8, 0, 1, 0, 0}, {0.85, 0, 0, 0, 0}, {0.8, 0, 0, 0, 1}};
    replay(t, "patience 2", &c, a, 4);
    /* min_delta 0.1: 0.85 after 1.0 is not enough (needs < 0.9); 0.89 is; 0.8 is not (< 0.79
     * needed): wait 1 (epoch 2), 0 (epoch 3), 1 (epoch 4), 2 (epoch 5): stop at 5 */
    c = TRAIN(t, "early_stop_patience", "2", "min_delta", "0.1");
    const epoch_case b[] = {{1.0, 0, 1, 0, 0},
                            {0.95, 0, 0, 0, 0},
                            {0.89, 0, 1, 0, 0},
                            {0.8, 0, 0, 0, 0},
                            {0.85, 0, 0, 0, 1}};
    replay(t, "min_delta 0.1", &c, b, 5);
    /* monitor = val_acc: higher is better, an equal value is no improvement */
    c = TRAIN(t, "early_stop_patience", "1", "monitor", "val_acc");
    const epoch_case d[] = {{9.0, 0.5, 1, 0, 0}, {9.0, 0.6, 1, 0, 0}, {0.1, 0.6, 0, 0, 1}};
    replay(t, "val_acc", &c, d, 3);
    /* patience 1 never stops at the first epoch, whatever its value */
    c = TRAIN(t, "early_stop_patience", "1");
    const epoch_case f[] = {{5.0, 0, 1, 0, 0}, {4.0, 0, 1, 0, 0}, {4.5, 0, 0, 0, 1}};
    replay(t, "patience 1", &c, f, 3);
    /* no early stopping: the best is still tracked (best.safetensors), nothing stops */
    c = TRAIN(t, "monitor", "val_loss");
    const epoch_case g[] = {
        {1.0, 0, 1, 0, 0}, {2.0, 0, 0, 0, 0}, {3.0, 0, 0, 0, 0}, {0.5, 0, 1, 0, 0}};
    replay(t, "no early stopping", &c, g, 4);

    /* ReduceLROnPlateau(patience=2, cooldown=1): flat val_loss. Epoch 1 sets the best; 2: wait
     * 1; 3: wait 2 -> cut, cooldown 1; 4: cooldown ends (0), wait 0, then counts: wait 1; 5:
     * wait 2 -> cut; 6: cooldown, wait 1 after it... 7: cut again. A lower loss at 8 is an
     * improvement (min_delta 1e-4), which resets the wait. */
    c = TRAIN(t, "lr_schedule", "plateau", "lr_plateau_patience", "2", "lr_plateau_cooldown", "1");
    const epoch_case p[] = {{1, 0, 1, 0, 0}, {1, 0, 0, 0, 0},   {1, 0, 0, 1, 0},
                            {1, 0, 0, 0, 0}, {1, 0, 0, 1, 0},   {1, 0, 0, 0, 0},
                            {1, 0, 0, 1, 0}, {0.5, 0, 1, 0, 0}, {0.5, 0, 0, 0, 0}};
    replay(t, "plateau, cooldown 1", &c, p, 9);
    /* cooldown 2: cut at 3; 4 in cooldown (1 left, nothing counted); 5: cooldown ends, wait 1;
     * 6: wait 2 -> cut. And a change smaller than min_delta (1e-4) is no improvement. */
    c = TRAIN(t, "lr_schedule", "plateau", "lr_plateau_patience", "2", "lr_plateau_cooldown", "2");
    const epoch_case q[] = {{1, 0, 1, 0, 0},      {1, 0, 0, 0, 0}, {1, 0, 0, 1, 0},
                            {1, 0, 0, 0, 0},      {1, 0, 0, 0, 0}, {0.99995, 0, 1, 1, 0},
                            {0.99995, 0, 0, 0, 0}};
    replay(t, "plateau, cooldown 2", &c, q, 7);

    /* damaged history text is refused, the good one round-trips */
    mgt_monitor_state st;
    mgt_err e;
    CHECK_ERR(t, mgt_monitor_parse("1 2 3", &st, &e), &e, "damaged");
    CHECK_ERR(t, mgt_monitor_parse("1 0.5 3 0 0.5 0 0 0", &st, &e), &e, "damaged"); /* best 3>1 */
    CHECK_ERR(t, mgt_monitor_parse("2 0.5 1 -1 0.5 0 0 0", &st, &e), &e, "damaged");
    CHECK_ERR(t, mgt_monitor_parse("2 nan 1 0 0.5 0 0 0", &st, &e), &e, "damaged");
    CHECK_ERR(t, mgt_monitor_parse("2 0.5 1 0 0.5 0 0 0 junk", &st, &e), &e, "damaged");
    CHECK(t, mgt_monitor_parse("3 0.25 2 1 0.25 1 0 1", &st, &e) == 0 && st.seen == 3 &&
                 st.best == 0.25 && st.best_epoch == 2 && st.cuts == 1);
}

static void test_keys(tally *t) {
    mgt_train_cfg c;
    mgt_train_defaults(&c);
    mgt_err e;
    CHECK_ERR(t, mgt_train_set(&c, "lr_schedule", "cosin", &e), &e, "lr_schedule = cosin",
              "did you mean cosine", "plateau");
    CHECK_ERR(t, mgt_train_set(&c, "lr_decay_epochs", "30,20", &e), &e, "lr_decay_epochs",
              "increasing");
    CHECK_ERR(t, mgt_train_set(&c, "lr_decay_epochs", "0", &e), &e, "lr_decay_epochs");
    CHECK_ERR(t, mgt_train_set(&c, "lr_decay_rate", "0", &e), &e, "lr_decay_rate = 0");
    CHECK_ERR(t, mgt_train_set(&c, "warmup_steps", "-5", &e), &e, "warmup_steps = -5");
    CHECK_ERR(t, mgt_train_set(&c, "lr_plateau_factor", "1", &e), &e, "lr_plateau_factor");
    CHECK_ERR(t, mgt_train_set(&c, "clip_norm", "-1", &e), &e, "clip_norm = -1", "e.g.");
    CHECK_ERR(t, mgt_train_set(&c, "clip_value", "x", &e), &e, "clip_value = x");
    CHECK_ERR(t, mgt_train_set(&c, "label_smoothing", "1.5", &e), &e, "label_smoothing = 1.5");
    CHECK_ERR(t, mgt_train_set(&c, "monitor", "loss", &e), &e, "monitor = loss", "val_loss");
    CHECK_ERR(t, mgt_train_set(&c, "early_stop_patience", "two", &e), &e, "early_stop_patience");
    CHECK_ERR(t, mgt_train_set(&c, "restore_best_weights", "maybe", &e), &e,
              "restore_best_weights");

    /* the keys together */
    c = TRAIN(t, "lr_schedule", "step");
    CHECK_ERR(t, mgt_train_check(&c, 1, &e), &e, "lr_schedule = step needs lr_decay_epochs");
    c = TRAIN(t, "lr_schedule", "cosine", "lr_decay_epochs", "3,4");
    CHECK_ERR(t, mgt_train_check(&c, 1, &e), &e, "a list of epochs is for lr_schedule = step");
    c = TRAIN(t, "lr_decay_epochs", "3");
    CHECK_ERR(t, mgt_train_check(&c, 1, &e), &e, "lr_schedule = constant does not use it");
    c = TRAIN(t, "warmup_steps", "10", "warmup_epochs", "1");
    CHECK_ERR(t, mgt_train_check(&c, 1, &e), &e, "warmup_steps", "warmup_epochs", "keep one");
    c = TRAIN(t, "lr_schedule", "plateau");
    CHECK(t, mgt_train_check(&c, 1, &e) == 0);
    CHECK_ERR(t, mgt_train_check(&c, 0, &e), &e, "plateau", "--no-validation");
    c = TRAIN(t, "early_stop_patience", "3");
    CHECK_ERR(t, mgt_train_check(&c, 0, &e), &e, "early stopping", "--no-validation");
    c = TRAIN(t, "lr_schedule", "STEP", "lr_decay_epochs", "30,60,80");
    CHECK(t, mgt_train_check(&c, 0, &e) == 0 && c.sched.kind == MGT_LR_STEP &&
                 c.sched.npoints == 3 && c.sched.points[2] == 80.0f);

    /* every new key is one [train] accepts (the model file's list, its "did you mean" too) */
    const char *keys[64];
    const int n = mgt_train_keys(keys, 64);
    const char *want[] = {"lr_schedule",         "warmup_epochs",        "clip_norm",
                          "clip_value",          "early_stop_patience",  "monitor",
                          "min_delta",           "restore_best_weights", "label_smoothing",
                          "lr_plateau_min_delta"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int found = 0;
        for (int k = 0; k < n; k++)
            found |= !strcmp(keys[k], want[i]);
        CHECK(t, found);
    }
    CHECK(t, n < 63); /* room left: the list is not cut */
}

int main(void) {
    tally t = {0, 0};
    test_rates(&t);
    test_history(&t);
    test_keys(&t);
    printf("test_schedule: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
