/* plot.h: RUN_DIR/curves.png from RUN_DIR/metrics.csv and RUN_DIR/run.json, drawn by gnuplot. */
#ifndef MGT_PLOT_H
#define MGT_PLOT_H

#include "util.h"

int mgt_plot(const char *run_dir, mgt_err *err);

#endif
