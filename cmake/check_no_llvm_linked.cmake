# Fails when FILE (a library or program) needs libLLVM or libclang-cpp: LLVM is
# reached through the plugin only (compiler/llvm_plugin.h).
# Run as: cmake -DFILE=<path> -P this.
execute_process(COMMAND readelf -d ${FILE} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${FILE} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
if(NOT needed)
  message(FATAL_ERROR "${FILE}: no NEEDED entries found; is it a dynamic ELF file?")
endif()
foreach(line ${needed})
  if(line MATCHES "libLLVM|libclang|liblld")
    message(FATAL_ERROR "${FILE} links LLVM directly: ${line}")
  endif()
endforeach()
message(STATUS "${FILE}: links no LLVM library")
