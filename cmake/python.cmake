# The nanobind extension pypto._C. Two ways in:
#  - pip install . (scikit-build-core sets SKBUILD): installed into the wheel's pypto/ folder;
#  - the in-tree development build (scripts/test.sh): written next to the package sources in
#    python/pypto/, so `PYTHONPATH=python` imports the fresh build (the file is git-ignored).
if(SKBUILD)
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
else()
  if(NOT PTO_PYTHON)
    message(FATAL_ERROR "PTO_BUILD_PYTHON needs -DPTO_PYTHON=<python with nanobind>")
  endif()
  set(Python_EXECUTABLE ${PTO_PYTHON})
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
endif()
execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
                OUTPUT_VARIABLE nanobind_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE nanobind_rc)
if(NOT nanobind_rc EQUAL 0)
  message(FATAL_ERROR "nanobind is not installed in ${Python_EXECUTABLE} (scripts/setup.sh installs it)")
endif()
find_package(nanobind CONFIG REQUIRED)

file(GLOB PTO_PY_SOURCES CONFIGURE_DEPENDS python/src/*.cpp)
nanobind_add_module(pypto_C NB_STATIC ${PTO_PY_SOURCES})
set_target_properties(pypto_C PROPERTIES OUTPUT_NAME _C)
target_link_libraries(pypto_C PRIVATE pto_lib)
pto_set_warnings(pypto_C)
if(SKBUILD)
  install(TARGETS pypto_C LIBRARY DESTINATION pypto)
  install(TARGETS pto_cli RUNTIME DESTINATION "${SKBUILD_SCRIPTS_DIR}")
else()
  set_target_properties(pypto_C PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_SOURCE_DIR}/python/pypto)
endif()
