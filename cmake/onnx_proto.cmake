# Generates C++ for onnx.proto from the installed onnx Python package at build time, so the schema
# always matches the onnx the tests use. Nothing generated is checked in.
find_package(Protobuf REQUIRED)

if(NOT PTO_ONNX_PROTO)
  if(NOT PTO_PYTHON)
    find_program(PTO_PYTHON NAMES python3 python REQUIRED)
  endif()
  execute_process(
    COMMAND ${PTO_PYTHON} -c "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'onnx.proto'))"
    OUTPUT_VARIABLE PTO_ONNX_PROTO OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${PTO_ONNX_PROTO}")
    message(FATAL_ERROR "onnx.proto not found: install the onnx Python package into ${PTO_PYTHON} "
                        "(scripts/setup.sh does) or pass -DPTO_ONNX_PROTO=/path/to/onnx.proto")
  endif()
endif()
set(PTO_ONNX_PROTO "${PTO_ONNX_PROTO}" CACHE FILEPATH "onnx.proto to generate from")
message(STATUS "onnx.proto: ${PTO_ONNX_PROTO}")

set(_gen "${CMAKE_BINARY_DIR}/generated/onnx")
get_filename_component(_proto_dir "${PTO_ONNX_PROTO}" DIRECTORY)
add_custom_command(
  OUTPUT "${_gen}/onnx.pb.cc" "${_gen}/onnx.pb.h"
  COMMAND ${CMAKE_COMMAND} -E make_directory "${_gen}"
  COMMAND protobuf::protoc --cpp_out=${_gen} -I${_proto_dir} ${PTO_ONNX_PROTO}
  DEPENDS "${PTO_ONNX_PROTO}"
  COMMENT "Generating C++ from onnx.proto")
add_library(pto_onnx_proto STATIC "${_gen}/onnx.pb.cc")
set_target_properties(pto_onnx_proto PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(pto_onnx_proto SYSTEM PUBLIC "${_gen}")
target_link_libraries(pto_onnx_proto PUBLIC protobuf::libprotobuf)

# The newest default-domain opset the installed onnx knows: the importer accepts up to it.
if(PTO_PYTHON)
  execute_process(
    COMMAND ${PTO_PYTHON} -c "import onnx.defs; print(onnx.defs.onnx_opset_version())"
    OUTPUT_VARIABLE PTO_ONNX_MAX_OPSET OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
endif()
if(NOT PTO_ONNX_MAX_OPSET)
  set(PTO_ONNX_MAX_OPSET 23)
endif()
message(STATUS "newest ONNX opset: ${PTO_ONNX_MAX_OPSET}")
target_compile_definitions(pto_onnx_proto PUBLIC PTO_ONNX_MAX_OPSET=${PTO_ONNX_MAX_OPSET})
