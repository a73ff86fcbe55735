# sluice_bpf_skeleton(NAME SOURCE) compiles SOURCE (a .bpf.c) with clang for
# the BPF target and generates ${NAME}.skel.h with bpftool into the build
# tree. The skeleton embeds the object, so binaries need no .o at run time.
# Defines the INTERFACE target `${NAME}_skel` that puts the header on the
# include path.
find_program(BPF_CLANG NAMES clang clang-16 clang-15 clang-14 REQUIRED)
find_program(BPFTOOL NAMES bpftool PATHS /usr/sbin /usr/local/sbin REQUIRED)
execute_process(COMMAND ${CMAKE_C_COMPILER} -print-multiarch
  OUTPUT_VARIABLE BPF_MULTIARCH OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT BPF_MULTIARCH)
  set(BPF_MULTIARCH "${CMAKE_SYSTEM_PROCESSOR}-linux-gnu")
endif()

function(sluice_bpf_skeleton name source)
  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.bpf.o)
  set(skel_dir ${CMAKE_CURRENT_BINARY_DIR}/skel)
  set(skel ${skel_dir}/${name}.skel.h)
  set(dep ${obj}.d)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -g -O2 -target bpf -Wall -Werror
            -D__TARGET_ARCH_x86
            -I/usr/include/${BPF_MULTIARCH}
            -I${PROJECT_SOURCE_DIR}
            -I${CMAKE_CURRENT_SOURCE_DIR}
            -MD -MF ${dep}
            -c ${CMAKE_CURRENT_SOURCE_DIR}/${source} -o ${obj}
    DEPFILE ${dep}
    DEPENDS ${source}
    COMMENT "BPF ${source}"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${skel_dir}
    COMMAND ${BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}.tmp
    COMMAND ${CMAKE_COMMAND} -E rename ${skel}.tmp ${skel}
    DEPENDS ${obj}
    COMMENT "skeleton ${name}.skel.h"
    VERBATIM)
  add_custom_target(${name}_skel_gen DEPENDS ${skel})
  add_library(${name}_skel INTERFACE)
  add_dependencies(${name}_skel ${name}_skel_gen)
  target_include_directories(${name}_skel INTERFACE ${skel_dir})
endfunction()
