/* kvindex/event.c: being written */
