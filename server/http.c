/* server/http.c: being written */
