#!/usr/bin/env bash
# device_prepare_dry: `prepare-device --dry-run` of this build, once, for the tests of the GPU
# check that start from its kit (device_dry_run, device_faults, device_kit: CTest's fixture
# device_kit_dry). The kit goes to MGT_BUILD/device-kit-dry, its output to device-kit-dry.log and
# its exit status to device-kit-dry.rc; each test copies the kit into its own folder and checks
# that output (dry_kit in testlib.bash). Run with --clean, it removes them (the fixture's end), so
# that a test run by hand outside CTest prepares its own kit from the build as it is then.
set -uo pipefail
: "${MGT_BUILD:?run through ctest}" "${MGT_SRC:?}"
K=$MGT_BUILD/device-kit-dry
rm -rf "$K" "$K.log" "$K.rc"
[ "${1:-}" = --clean ] && exit 0
"$MGT_SRC/tests/gpu/prepare-device" --dry-run --build-dir "$MGT_BUILD" --dest "$K" >"$K.log" 2>&1
rc=$?
echo $rc >"$K.rc"
tail -n 3 "$K.log"
echo "prepare-device --dry-run: exit $rc (the tests check its output)"
exit 0
