/* common/json.c: being written */
