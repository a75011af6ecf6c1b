/* kvindex/event_json.c: being written */
