# Fails when the committed docs/manifest.md is not what `kiln
# manifest-reference` prints from the schema (a key added, a default changed).
# Run by CTest: cmake -DKILN=<kiln> -DDOC=<docs/manifest.md> -P <this file>
execute_process(COMMAND "${KILN}" manifest-reference
                OUTPUT_VARIABLE generated
                ERROR_VARIABLE error
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${KILN} manifest-reference failed (${result}): ${error}")
endif()
file(READ "${DOC}" committed)
if(NOT generated STREQUAL committed)
  message(FATAL_ERROR "${DOC} is stale (the manifest schema changed): refresh it with "
                      "`${KILN} manifest-reference > ${DOC}` and commit it")
endif()
