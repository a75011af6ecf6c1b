/* router-plugin/proto.c: being written */
