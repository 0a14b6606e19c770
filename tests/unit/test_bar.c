/* test_bar.c: the progress bar's line (src/metrics.c, mgt_metrics_bar_line) fitted to a terminal
 * width: for every width from 1 to 200 columns and several positions, the line leaves the last
 * column free (a character there makes some terminals wrap, and a wrapped bar scrolls a line at
 * every redraw), starts with the step count, keeps Keras' full line where it fits (a 30-column
 * bar at 80 columns for Keras' example line) and drops parts in the documented order when it does
 * not: the accuracy, then the ETA or status, then the bar, then the loss. */
#include <stdio.h>
#include <string.h>

#include "metrics.h"

#include "tally.h"

static void check_width(tally *t, const mgt_bar *b, const char *status) {
    char count[64];
    snprintf(count, sizeof count, "%*lld/%lld", snprintf(NULL, 0, "%lld", (long long)b->steps),
             (long long)b->step, (long long)b->steps);
    int prev_len = 0;
    for (int w = 1; w <= 200; w++) {
        char line[256];
        mgt_metrics_bar_line(line, sizeof line, w, b, status);
        const int len = (int)strlen(line);
        const int fits = len <= (w > 1 ? w - 1 : 1);
        CHECK(t, fits);
        CHECK(t,
              !strncmp(line, count, (size_t)(len < (int)strlen(count) ? len : (int)strlen(count))));
        CHECK(t, len >= prev_len); /* a wider terminal never shows less */
        if (!fits)
            fprintf(stderr, "  width %d: %d characters: '%s'\n", w, len, line);
        prev_len = len;
        const char *bar = strchr(line, '[');
        const int has_acc = strstr(line, b->mae ? " - mae: " : " - acc: ") != NULL;
        const int has_eta = strstr(line, status ? status : " - ETA: ") != NULL;
        const int has_loss = strstr(line, " - loss: ") != NULL;
        /* the order parts go in: acc before the ETA/status, those before the bar, the bar
         * before the loss */
        CHECK(t, !has_acc || has_eta);
        CHECK(t, !has_eta || bar);
        CHECK(t, !bar || has_loss || len == w - 1);
        /* every part at 80 columns (the bar narrower where the counts are long), and the
         * 30-cell bar too at 100 */
        if ((w >= 80 && b->steps < 1000000) || w >= 100) {
            CHECK(t, has_acc && has_eta && bar);
            if (!(has_acc && has_eta && bar))
                fprintf(stderr, "  width %d: not the full line: '%s'\n", w, line);
        }
        if (w >= (b->has_top5 ? 120 : 100))
            CHECK(t, bar && bar[31] == ']');
    }
}

int main(void) {
    tally t = {0, 0};
    const mgt_bar bars[] = {{0, 1, 235, 12.0, 2.3026, 0.1, 0, 0, 0},
                            {0, 120, 235, 1.0, 0.6415, 0.776, 0, 0, 0},
                            {0, 235, 235, 0.0, 0.4466, 0.8456, 0, 0, 0},
                            {3, 59999, 60000, 1234.0, 12.5, 0.5, 0, 0, 0}, /* wide counts */
                            {0, 7, 12345678, 99999.0, 1e6, 1.0, 0, 0, 0},
                            {0, 120, 235, 1.0, 0.6415, 0.776, 1, 0.9512, 0}, /* top-5 */
                            {0, 120, 235, 1.0, 31.25, 4.5, 0, 0, 1}};        /* regression */
    for (size_t i = 0; i < sizeof bars / sizeof bars[0]; i++) {
        check_width(&t, &bars[i], NULL);
        check_width(&t, &bars[i], "validating");
    }
    /* the bar's cells at 80 columns: 120/235 of 30 is 15 cells, the 15th the arrow */
    char line[256];
    mgt_metrics_bar_line(line, sizeof line, 80, &bars[1], NULL);
    CHECK(&t, !strcmp(line, "120/235 [==============>...............] - ETA: 1s - loss: 0.6415 - "
                            "acc: 0.7760"));
    mgt_metrics_bar_line(line, sizeof line, 100, &bars[2], "validating");
    CHECK(&t,
          !strcmp(line, "235/235 [==============================] - validating - loss: 0.4466 - "
                        "acc: 0.8456"));
    printf("%s\n", line);
    /* 50 columns: the bar narrows to fit everything but the accuracy */
    mgt_metrics_bar_line(line, sizeof line, 50, &bars[1], NULL);
    CHECK(&t, !strcmp(line, "120/235 [====>.....] - ETA: 1s - loss: 0.6415"));
    printf("%s\n", line);
    /* top-5 after the accuracy where there is room, and the first part to go where there is not */
    mgt_metrics_bar_line(line, sizeof line, 100, &bars[5], NULL);
    CHECK(&t, !strcmp(line, "120/235 [==============>...............] - ETA: 1s - loss: 0.6415 - "
                            "acc: 0.7760 - top5_acc: 0.9512"));
    printf("%s\n", line);
    mgt_metrics_bar_line(line, sizeof line, 80, &bars[5], NULL);
    CHECK(&t, !strcmp(line, "120/235 [====>......] - ETA: 1s - loss: 0.6415 - acc: 0.7760 - "
                            "top5_acc: 0.9512"));
    printf("%s\n", line);
    mgt_metrics_bar_line(line, sizeof line, 60, &bars[5], NULL);
    CHECK(&t, !strcmp(line, "120/235 [====>.....] - ETA: 1s - loss: 0.6415 - acc: 0.7760"));
    printf("%s\n", line);
    /* a regression's bar: its mean absolute error where the others show accuracy */
    mgt_metrics_bar_line(line, sizeof line, 100, &bars[6], NULL);
    CHECK(&t, !strcmp(line, "120/235 [==============>...............] - ETA: 1s - loss: 31.2500 - "
                            "mae: 4.5000"));
    printf("%s\n", line);
    printf("test_bar: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
