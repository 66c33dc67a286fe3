# kiln_link_backends(<target> [<variable>])
# Links <target> with Kiln's delegate backends: each is a static library, kiln::backend_<name>, that
# registers its backend when it is linked (docs/packaging.md). Used by examples/*/CMakeLists.txt
# inside Kiln's tree, and by apps built against an installed Kiln (kilnConfig.cmake includes this).
#   - <variable> not given, or not defined: every backend this Kiln has and can link (for an
#     installed Kiln, kiln_backend_<name>_FOUND: kiln::backend_mlx also needs MLX's CMake package);
#     a given <variable> is then set to that list in the caller's scope.
#   - <variable> defined: the backends it lists, possibly none (kiln::runtime alone: a delegated
#     program then fails to load with NotFound naming its backend). A name that this Kiln cannot
#     link is a FATAL_ERROR naming it and the backends it has.
function(kiln_link_backends target)
  string(REPLACE ";" " " _call "${ARGV}")
  if(ARGC GREATER 2)
    message(FATAL_ERROR "kiln_link_backends(${_call}): takes a target and at most one list variable's name, "
                        "e.g. set(MY_BACKENDS xnnpack) then kiln_link_backends(${target} MY_BACKENDS)")
  endif()
  if(ARGC EQUAL 2 AND ARGV1 MATCHES "^(xnnpack|mlx)$")
    message(FATAL_ERROR "kiln_link_backends(${_call}): the second argument names a list variable, not a "
                        "backend: set(MY_BACKENDS ${ARGV1}) then kiln_link_backends(${target} MY_BACKENDS)")
  endif()
  set(_available "")
  foreach(_b xnnpack mlx)
    if(TARGET kiln::backend_${_b} AND (NOT DEFINED kiln_backend_${_b}_FOUND OR kiln_backend_${_b}_FOUND))
      list(APPEND _available ${_b})
    endif()
  endforeach()
  if(ARGC GREATER 1 AND DEFINED ${ARGV1})
    set(_wanted ${${ARGV1}})
    foreach(_b IN LISTS _wanted)
      if(NOT _b IN_LIST _available)
        list(JOIN _available ", " _have)
        message(FATAL_ERROR "${ARGV1}: this Kiln cannot link backend '${_b}' (no usable kiln::backend_${_b}; "
                            "it has: ${_have}). For an installed Kiln, find_package(kiln COMPONENTS "
                            "backend_${_b}) says why.")
      endif()
    endforeach()
  else()
    set(_wanted ${_available})
    if(ARGC GREATER 1)
      set(${ARGV1} ${_wanted} PARENT_SCOPE)
    endif()
  endif()
  foreach(_b IN LISTS _wanted)
    target_link_libraries(${target} PRIVATE kiln::backend_${_b})
  endforeach()
endfunction()
