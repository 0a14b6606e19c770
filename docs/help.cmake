# help.cmake: what man.cmake and cli.cmake share: running `mgtrain [COMMAND] --help`, and the
# list of commands that `mgtrain --help` names. Included by both; MGTRAIN is the binary.

# mgtrain --help must run as a plain process: not as a rank (a build inside a Slurm step or an
# mpirun would look like one), and without a sanitizer build's leak report failing the call.
foreach(v SLURM_STEP_ID OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK)
  unset(ENV{${v}})
endforeach()
set(ENV{ASAN_OPTIONS} "detect_leaks=0")

# mgt_help(OUT [COMMAND]): OUT is the text of `mgtrain --help`, or of `mgtrain COMMAND --help`.
function(mgt_help out)
  execute_process(COMMAND ${MGTRAIN} ${ARGN} --help OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " words "${ARGN}")
    message(FATAL_ERROR "${MGTRAIN} ${words} --help failed (${rc})")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# mgt_help_lines(OUT TEXT): the lines of TEXT as a list. A line's ";", "[" and "]" would split it
# or join it with the next as list elements: they stand as the control characters 1, 2 and 3 in
# OUT, which mgt_help_unmask turns back.
string(ASCII 1 MGT_HELP_SEMICOLON)
string(ASCII 2 MGT_HELP_OPEN)
string(ASCII 3 MGT_HELP_CLOSE)
function(mgt_help_lines out text)
  string(REPLACE ";" "${MGT_HELP_SEMICOLON}" text "${text}")
  string(REPLACE "[" "${MGT_HELP_OPEN}" text "${text}")
  string(REPLACE "]" "${MGT_HELP_CLOSE}" text "${text}")
  string(REGEX REPLACE "\n$" "" text "${text}")
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(mgt_help_unmask var)
  set(s "${${var}}")
  string(REPLACE "${MGT_HELP_SEMICOLON}" ";" s "${s}")
  string(REPLACE "${MGT_HELP_OPEN}" "[" s "${s}")
  string(REPLACE "${MGT_HELP_CLOSE}" "]" s "${s}")
  set(${var} "${s}" PARENT_SCOPE)
endfunction()

# mgt_help_commands(NAMES SUMMARIES): the commands of `mgtrain --help`'s "commands:" list, in its
# order, and each one's description (its continuation lines joined), masked as mgt_help_lines
# masks them. Every command the binary lists is found, so a new one needs no edit here.
function(mgt_help_commands names summaries)
  mgt_help(text)
  mgt_help_lines(lines "${text}")
  set(in 0)
  set(n "")
  set(d "")
  foreach(line IN LISTS lines)
    if(line STREQUAL "commands:")
      set(in 1)
    elseif(in AND line MATCHES "^  ([a-z][a-z0-9-]*)  +(.*)$")
      list(APPEND n "${CMAKE_MATCH_1}")
      list(APPEND d "${CMAKE_MATCH_2}")
    elseif(in AND line MATCHES "^   +(.*)$" AND NOT d STREQUAL "")
      list(POP_BACK d last)
      list(APPEND d "${last} ${CMAKE_MATCH_1}")
    elseif(in)
      break()
    endif()
  endforeach()
  if(n STREQUAL "")
    message(FATAL_ERROR "no \"commands:\" list in ${MGTRAIN} --help")
  endif()
  set(${names} "${n}" PARENT_SCOPE)
  set(${summaries} "${d}" PARENT_SCOPE)
endfunction()
