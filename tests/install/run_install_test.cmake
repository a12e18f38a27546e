# The install test: cmake --install the build into a fresh prefix, configure and
# build tests/install against it with find_package(flashjit), run both consumers.
# Run as: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=...
#               -DC_COMPILER=... -DCXX_COMPILER=... -P run_install_test.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/flashjit/flashjit.h include/flashjit/runtime/attention.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()
file(GLOB_RECURSE config ${prefix}/*/flashjitConfig.cmake)
if(NOT config)
  message(FATAL_ERROR "not installed: flashjitConfig.cmake under ${prefix}")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer_c)
run(${WORK_DIR}/build/consumer_cxx)
run(${WORK_DIR}/build/consumer_hpp)

# pkg-config: the C consumer built from flashjit.pc's flags alone.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  file(GLOB_RECURSE pc ${prefix}/*/pkgconfig/flashjit.pc)
  if(NOT pc)
    message(FATAL_ERROR "not installed: pkgconfig/flashjit.pc under ${prefix}")
  endif()
  get_filename_component(pc_dir ${pc} DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${pc_dir})
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs flashjit OUTPUT_VARIABLE flags
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs flashjit failed (${rc})")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  get_filename_component(libdir ${pc_dir} DIRECTORY)
  run(${C_COMPILER} -std=c99 ${SOURCE_DIR}/consumer.c ${flags} -lm -Wl,-rpath,${libdir}
      -o ${WORK_DIR}/consumer_pkg_config)
  run(${WORK_DIR}/consumer_pkg_config)
  # The header-only C++ interface from the same flags: nothing but the C library.
  run(${CXX_COMPILER} -std=c++17 ${SOURCE_DIR}/consumer_hpp.cpp ${flags} -Wl,-rpath,${libdir}
      -o ${WORK_DIR}/consumer_hpp_pkg_config)
  run(${WORK_DIR}/consumer_hpp_pkg_config)
else()
  message(WARNING "pkg-config not found: flashjit.pc is installed but not tried")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
