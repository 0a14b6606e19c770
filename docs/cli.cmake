# cli.cmake: writes the command-line reference (docs/cli.md) from `mgtrain --help` and each
# command's --help, the text the man page is made from (man.cmake), so that neither can disagree
# with the binary or with the other.
#   cmake -DMGTRAIN=path/to/mgtrain -DOUT=docs/cli.md -P cli.cmake
# The build's target docs-cli runs it on the built mgtrain into the source tree, and
# tests/cli/docs.sh fails when the committed page differs from what it writes.
#
# Every command the general help lists gets a section: its usage line, its flags as a table
# (flag, meaning, default: a help line is "  --NAME [VALUE]  MEANING (default: DEFAULT)"), and
# any other line of its help as text. Nothing here names a command or a flag.
cmake_minimum_required(VERSION 3.24)
foreach(v MGTRAIN OUT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "cli.cmake: -D${v}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/help.cmake)

# md_text(VAR): VAR's text made safe as Markdown table-cell text: nothing in it may start
# emphasis, code, an HTML tag or an entity, or end the cell.
function(md_text var)
  set(s "${${var}}")
  mgt_help_unmask(s)
  string(REPLACE "\\" "\\\\" s "${s}")
  string(REPLACE "&" "&amp;" s "${s}")
  string(REPLACE "<" "&lt;" s "${s}")
  string(REPLACE ">" "&gt;" s "${s}")
  string(REPLACE "*" "\\*" s "${s}")
  string(REPLACE "`" "\\`" s "${s}")
  string(REPLACE "|" "\\|" s "${s}")
  set(${var} "${s}" PARENT_SCOPE)
endfunction()

# md_code(VAR): VAR as a code span in a table cell (only "|" needs its backslash there).
function(md_code var)
  set(s "${${var}}")
  mgt_help_unmask(s)
  string(REPLACE "|" "\\|" s "${s}")
  set(${var} "`${s}`" PARENT_SCOPE)
endfunction()

mgt_help_commands(names summaries)

set(md [=[
# Command-line reference

<!-- Made by docs/cli.cmake from `mgtrain --help` and each command's --help: do not edit.
     After changing a flag or a command: cmake --build build --target docs-cli -->

Every command of `mgtrain` and every flag, with its default, as `mgtrain --help` and
`mgtrain COMMAND --help` (or `-h`) print them; the man page (`man mgtrain` once installed,
`man -l build/mgtrain.1` in the build) is made from the same text. `mgtrain --version` prints the version and the backends built in (OpenBLAS, CUDA, cuDNN,
NCCL, MPI). Flags must be spelled out; a wrong one is named with the closest valid one. A default
that names a `[train]` key is the model file's ([Model files](model-files.md)): the flag overrides
it. What the flags are for, topic by topic: the [User guide](guide.md) and the pages it links.

Usage: `mpirun -np N mgtrain [COMMAND] [FLAGS]`, or `mgtrain [COMMAND] [FLAGS]` for one process.

## Commands

| command | what it does |
|---|---|
]=])
foreach(name summary IN ZIP_LISTS names summaries)
  md_text(summary)
  string(APPEND md "| [`${name}`](#mgtrain-${name}) | ${summary} |\n")
endforeach()

foreach(name IN LISTS names)
  mgt_help(text ${name})
  mgt_help_lines(lines "${text}")
  string(APPEND md "\n## mgtrain ${name}\n")
  set(table 0)
  set(prose 0)
  foreach(line IN LISTS lines)
    set(was_prose ${prose})
    set(prose 0)
    if(line MATCHES "^usage: (.*)$")
      set(u "${CMAKE_MATCH_1}")
      md_code(u)
      string(APPEND md "\nUsage: ${u}\n")
    elseif(line MATCHES "^  (--[a-z0-9-]+)( [^ ]+)? +(.*)$")
      set(flag "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      set(meaning "${CMAKE_MATCH_3}")
      set(default "")
      string(FIND "${meaning}" " (default: " at)
      if(at GREATER -1)
        math(EXPR from "${at} + 11")
        string(SUBSTRING "${meaning}" ${from} -1 default)
        string(REGEX REPLACE "\\)$" "" default "${default}")
        string(SUBSTRING "${meaning}" 0 ${at} meaning)
      endif()
      md_code(flag)
      md_text(meaning)
      md_text(default)
      if(NOT table)
        string(APPEND md "\n| flag | meaning | default |\n|---|---|---|\n")
        set(table 1)
      endif()
      string(APPEND md "| ${flag} | ${meaning} | ${default} |\n")
    elseif(line MATCHES "^flags:?$" OR line STREQUAL "")
      # the table's own heading, and the blank lines between the parts
    else() # text: consecutive lines make one paragraph
      md_text(line)
      if(NOT was_prose)
        string(APPEND md "\n")
      endif()
      string(APPEND md "${line}\n")
      set(prose 1)
    endif()
  endforeach()
endforeach()

file(WRITE ${OUT}.tmp "${md}")
file(RENAME ${OUT}.tmp ${OUT})
