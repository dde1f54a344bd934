# Warnings are errors in CI (PTO_WERROR=ON by default); sanitizers on request.
function(pto_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  if(PTO_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(PTO_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
