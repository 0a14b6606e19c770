# man.cmake: writes mgtrain.1 with help2man, run by the build (cmake -P) after mgtrain is linked.
#   cmake -DHELP2MAN=... -DMGTRAIN=path/to/mgtrain -DVERSION=x.y.z -DOUT=mgtrain.1 -P man.cmake
#
# help2man turns `mgtrain --help` (the commands and every flag of train, with defaults) into the
# page, so the page cannot disagree with the binary. The other commands' flags come from their
# own --help, added verbatim as a section through help2man's --include file, with the output
# files and the launch scripts. docs/cli.md is made from the same text (cli.cmake).
cmake_minimum_required(VERSION 3.24)
foreach(v HELP2MAN MGTRAIN VERSION OUT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "man.cmake: -D${v}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/help.cmake)

set(include "[NAME]\nmgtrain \\- data-parallel neural-network training, one MPI rank per device\n")
string(APPEND include "[SYNOPSIS]\n.B mpirun -np\n.I N\n.B mgtrain\n[\\fICOMMAND\\fR] [\\fIFLAGS\\fR]\n"
       ".br\n.B mgtrain\n[\\fICOMMAND\\fR] [\\fIFLAGS\\fR]\n")
string(APPEND include "[OTHER COMMANDS]\n")
# Every command `mgtrain --help` lists but train, whose flags are that help's own.
mgt_help_commands(commands summaries)
list(REMOVE_ITEM commands train)
foreach(cmd IN LISTS commands)
  mgt_help(help ${cmd})
  # Verbatim: backslashes doubled, and a line starting with . or ' is not taken for a request.
  string(REPLACE "\\" "\\\\" help "${help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
  string(APPEND include ".SS \"mgtrain ${cmd}\"\n.nf\n${help}.fi\n")
endforeach()
string(APPEND include [=[
[FILES]
Rank 0 writes into the --out folder (default runs/<model>):
.TP
.B weights.safetensors
the trained weights, in PyTorch's names and layouts
.TP
.B checkpoint.safetensors
weights, optimizer state and position, for --resume
.TP
.B metrics.jsonl, metrics.csv
one row per epoch: loss, accuracy, validation loss and accuracy, samples/s
.TP
.B tb/events.out.tfevents.*
TensorBoard event files (unless --no-tensorboard): tensorboard --logdir OUT/tb
.TP
.B run.json
the run's settings
[SEE ALSO]
.B mgtrun
(starts mpirun with one rank per GPU),
.B mgtrain.sbatch
(the Slurm template, in share/mgtrain), and the README and docs/ in share/doc/mgtrain.
]=])
file(WRITE ${OUT}.h2m "${include}")
execute_process(
  COMMAND ${HELP2MAN} --no-info --no-discard-stderr --version-string=${VERSION}
          --include=${OUT}.h2m --output=${OUT}.tmp ${MGTRAIN}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "man.cmake: help2man failed (${rc})")
endif()
file(RENAME ${OUT}.tmp ${OUT})
