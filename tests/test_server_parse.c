/* Server request parsing: OpenAI chat / completions and Anthropic messages
 * bodies -> validated requests, or errors with the right HTTP status, code
 * and param; the API error shapes; the UTF-8 checks; allocation failures at
 * every step (no leaks, no crash, a 500). */
#include <string.h>

#include "harness.h"
#include "server/server_impl.h"
#include "sluice/grammar.h"
#include "sluice/util.h"

static const char *names[] = {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "default"};
static const sl_srv_limits lim = {.model_names = names,
                                  .n_model_names = 3,
                                  .n_ctx = 2048,
                                  .chat_template = NULL,
                                  .toolfmt = SL_TOOLFMT_NONE};

static sl_status parse(sl_srv_api api, const char *body, sl_srv_request *r,
                       sl_srv_error *e) {
  return sl__srv_parse(api, body, strlen(body), &lim, r, e);
}

static void test_chat_ok(void) {
  sl_srv_request r;
  sl_srv_error e;
  CHECK_OK(parse(SL_SRV_CHAT,
                 "{\"model\":\"smollm2\",\"messages\":[{\"role\":\"system\","
                 "\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                 "[{\"type\":\"text\",\"text\":\"Hi \"},{\"type\":\"text\","
                 "\"text\":\"there\"}]}]}",
                 &r, &e));
  CHECK_EQ_INT(sl_jv_len(r.messages), 2);
  const sl_jv *m1 = sl_jv_list_get(r.messages, 1);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(m1, "role")), "user") == 0);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(m1, "content")), "Hi there") == 0);
  CHECK(!r.stream && !r.max_tokens_set && !r.logprobs);
  CHECK(r.gen.top_logprobs == -1);
  CHECK(r.gen.sampling.temperature == 1.0f && r.gen.sampling.top_p == 1.0f);
  CHECK_EQ_INT(r.gen.n_stop, 0);
  sl__srv_request_free(&r);

  CHECK_OK(
      parse(SL_SRV_CHAT,
            "{\"model\":\"default\",\"messages\":[{\"role\":\"developer\","
            "\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null},"
            "{\"role\":\"user\",\"content\":\"q\"}],\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true},\"stop\":"
            "[\"\\n\\n\",\"END\",\"\"],\"max_completion_tokens\":7,"
            "\"temperature\":0,\"top_p\":0.5,\"seed\":42,\"logprobs\":true,"
            "\"top_logprobs\":3,\"n\":1,\"response_format\":{\"type\":"
            "\"text\"},\"tools\":[],\"user\":\"u1\"}",
            &r, &e));
  CHECK(r.stream && r.include_usage && r.logprobs);
  CHECK_EQ_INT(r.top_logprobs, 3);
  CHECK_EQ_INT(r.gen.top_logprobs, 3);
  CHECK_EQ_INT(r.gen.max_tokens, 7);
  CHECK(r.max_tokens_set);
  CHECK(r.gen.sampling.temperature == 0.0f && r.gen.sampling.top_p == 0.5f);
  CHECK(r.gen.sampling.seed == 42);
  CHECK_EQ_INT(r.gen.n_stop, 2); /* the empty stop string is dropped */
  CHECK(strcmp(r.gen.stop[0], "\n\n") == 0 &&
        strcmp(r.gen.stop[1], "END") == 0);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(sl_jv_list_get(r.messages, 0), "role")),
               "system") == 0);
  CHECK(strcmp(
            sl_jv_str(sl_jv_dict_get(sl_jv_list_get(r.messages, 1), "content")),
            "") == 0);
  sl__srv_request_free(&r);

  CHECK_OK(parse(SL_SRV_CHAT,
                 "{\"model\":\"smollm2\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"stop\":\"###\",\"max_tokens\":2048}",
                 &r, &e));
  CHECK_EQ_INT(r.gen.n_stop, 1);
  CHECK(strcmp(r.gen.stop[0], "###") == 0);
  CHECK_EQ_INT(r.gen.max_tokens, 2048);
  sl__srv_request_free(&r);
}

static void test_completions_ok(void) {
  sl_srv_request r;
  sl_srv_error e;
  CHECK_OK(parse(SL_SRV_COMPLETIONS,
                 "{\"model\":\"smollm2\",\"prompt\":\"Once upon\","
                 "\"logprobs\":2}",
                 &r, &e));
  CHECK(r.prompt && strcmp(r.prompt, "Once upon") == 0);
  CHECK_EQ_INT(r.prompt_len, 9);
  CHECK_EQ_INT(r.gen.max_tokens, 16); /* the API's default */
  CHECK(r.logprobs);
  CHECK_EQ_INT(r.gen.top_logprobs, 2);
  sl__srv_request_free(&r);

  CHECK_OK(parse(SL_SRV_COMPLETIONS,
                 "{\"model\":\"smollm2\",\"prompt\":[1,2,3],\"max_tokens\":5,"
                 "\"logprobs\":0}",
                 &r, &e));
  CHECK(!r.prompt && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3);
  CHECK_EQ_INT(r.gen.max_tokens, 5);
  CHECK(r.logprobs);
  CHECK_EQ_INT(r.gen.top_logprobs, 0);
  sl__srv_request_free(&r);

  CHECK_OK(parse(SL_SRV_COMPLETIONS,
                 "{\"model\":\"smollm2\",\"prompt\":[\"only one\"]}", &r, &e));
  CHECK(r.prompt && strcmp(r.prompt, "only one") == 0);
  sl__srv_request_free(&r);
  CHECK_OK(parse(SL_SRV_COMPLETIONS,
                 "{\"model\":\"smollm2\",\"prompt\":[[5,6]]}", &r, &e));
  CHECK_EQ_INT(r.n_prompt_ids, 2);
  sl__srv_request_free(&r);
}

static void test_messages_ok(void) {
  sl_srv_request r;
  sl_srv_error e;
  CHECK_OK(
      parse(SL_SRV_MESSAGES,
            "{\"model\":\"SmolLM2-135M-Instruct.Q4_1.gguf\",\"max_tokens\""
            ":32,\"system\":[{\"type\":\"text\",\"text\":\"S1\"},{\"type\":"
            "\"text\",\"text\":\"S2\"}],\"messages\":[{\"role\":\"user\","
            "\"content\":\"hello\"},{\"role\":\"assistant\",\"content\":"
            "[{\"type\":\"text\",\"text\":\"hi\"}]},{\"role\":\"user\","
            "\"content\":\"more\"}],\"stop_sequences\":[\"\\n\"],"
            "\"temperature\":0.2,\"top_k\":5,\"top_p\":0.9,\"stream\":true,"
            "\"metadata\":{\"user_id\":\"x\"}}",
            &r, &e));
  CHECK_EQ_INT(sl_jv_len(r.messages), 4);
  const sl_jv *sys = sl_jv_list_get(r.messages, 0);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(sys, "role")), "system") == 0);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(sys, "content")), "S1S2") == 0);
  CHECK(r.stream && r.max_tokens_set && r.gen.max_tokens == 32);
  CHECK(r.gen.sampling.top_k == 5);
  CHECK_EQ_INT(r.gen.n_stop, 1);
  sl__srv_request_free(&r);
}

typedef struct bad_case {
  sl_srv_api api;
  const char *body;
  int http;
  const char *code;  /* NULL: not checked */
  const char *param; /* NULL: not checked */
} bad_case;

#define CHAT_MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
#define M         "\"model\":\"smollm2\""

static const bad_case bad[] = {
    {SL_SRV_CHAT, "{", 400, "invalid_json", NULL},
    {SL_SRV_CHAT, "", 400, "invalid_json", NULL},
    {SL_SRV_CHAT, "[]", 400, "invalid_json", NULL},
    {SL_SRV_CHAT, "{\"a\":1,\"a\":2}", 400, "invalid_json", NULL},
    {SL_SRV_CHAT, "{\"model\":\"\xff\"}", 400, "invalid_utf8", NULL},
    {SL_SRV_CHAT, "{\"model\":\"\xc0\x80\"}", 400, "invalid_utf8", NULL},
    {SL_SRV_CHAT, "{\"model\":\"\xed\xa0\x80\"}", 400, "invalid_utf8", NULL},
    {SL_SRV_CHAT, "{" CHAT_MSGS "}", 400, "missing_required_parameter",
     "model"},
    {SL_SRV_CHAT, "{\"model\":5," CHAT_MSGS "}", 400, "invalid_type", "model"},
    {SL_SRV_CHAT, "{\"model\":\"gpt-9\"," CHAT_MSGS "}", 404, "model_not_found",
     "model"},
    {SL_SRV_CHAT, "{" M "}", 400, "missing_required_parameter", "messages"},
    {SL_SRV_CHAT, "{" M ",\"messages\":[]}", 400, "invalid_value", "messages"},
    {SL_SRV_CHAT, "{" M ",\"messages\":\"hi\"}", 400, "invalid_type",
     "messages"},
    {SL_SRV_CHAT, "{" M ",\"messages\":[5]}", 400, "invalid_type",
     "messages[0]"},
    {SL_SRV_CHAT, "{" M ",\"messages\":[{\"content\":\"x\"}]}", 400,
     "missing_required_parameter", "messages[0]"},
    {SL_SRV_CHAT,
     "{" M ",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
     "invalid_value", "messages[0]"},
    {SL_SRV_CHAT, "{" M ",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
     400, "invalid_type", "messages[0].content"},
    {SL_SRV_CHAT, "{" M ",\"messages\":[{\"role\":\"user\"}]}", 400,
     "missing_required_parameter", "messages[0].content"},
    {SL_SRV_CHAT,
     "{" M ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
     "\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
     400, "unsupported_parameter", "messages[0].content"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"temperature\":\"hot\"}", 400,
     "invalid_type", "temperature"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"temperature\":3}", 400,
     "invalid_value", "temperature"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"top_p\":1.5}", 400, "invalid_value",
     "top_p"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"max_tokens\":0}", 400,
     "invalid_value", "max_tokens"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"max_tokens\":-5}", 400,
     "invalid_value", "max_tokens"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"top_k\":-2}", 400, "invalid_value",
     "top_k"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"min_p\":1.5}", 400, "invalid_value",
     "min_p"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"repetition_penalty\":0}", 400,
     "invalid_value", "repetition_penalty"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"repetition_penalty\":1.1,\"repeat_penalty\":1.1}",
     400, "invalid_value", "repetition_penalty"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logit_bias\":[1]}", 400,
     "invalid_type", "logit_bias"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logit_bias\":{\"x\":1}}", 400,
     "invalid_value", "logit_bias"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logit_bias\":{\"-3\":1}}", 400,
     "invalid_value", "logit_bias"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logit_bias\":{\"3\":101}}", 400,
     "invalid_value", "logit_bias"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logit_bias\":{\"3\":\"1\"}}", 400,
     "invalid_value", "logit_bias"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"continue_final_message\":true}", 400,
     "invalid_value", "continue_final_message"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"max_tokens\":\"10\"}", 400,
     "invalid_type", "max_tokens"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"max_completion_tokens\":1.5}", 400,
     "invalid_type", "max_completion_tokens"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"n\":17}", 400, "invalid_value", "n"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"n\":0}", 400, "invalid_value", "n"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"response_format\":{\"type\":\"xml\"}}", 400,
     "invalid_value", "response_format"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"response_format\":{\"type\":\"json_schema\"}}",
     400, "missing_required_parameter", "response_format"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\","
     "\"pattern\":\"^a\"}}}}",
     400, "invalid_value", "response_format"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\",\"schema\":{\"$ref\":\"#/x\"}}}}",
     400, "invalid_value", "response_format"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"response_format\":{\"type\":\"json_schema\","
     "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\","
     "\"properties\":{\"a\":{}},\"required\":[\"b\"]}}}}",
     400, "invalid_value", "response_format"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"grammar\":\"root ::= foo\"}", 400,
     "invalid_value", "grammar"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"grammar\":5}", 400, "invalid_type",
     "grammar"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"grammar\":\"root ::= \\\"a\\\"\","
     "\"response_format\":{\"type\":\"json_object\"}}",
     400, "invalid_value", "response_format"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"response_format\":\"json\"}", 400,
     "invalid_type", "response_format"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS
     ",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}",
     400, "invalid_value", "stop"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"stop\":[1]}", 400, "invalid_type",
     "stop"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"stop\":7}", 400, "invalid_type",
     "stop"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"top_logprobs\":2}", 400,
     "invalid_value", "top_logprobs"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logprobs\":true,\"top_logprobs\":21}",
     400, "invalid_value", "top_logprobs"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"logprobs\":1}", 400, "invalid_type",
     "logprobs"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"stream\":\"yes\"}", 400,
     "invalid_type", "stream"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"stream_options\":{\"include_usage\":true}}", 400,
     "invalid_value", "stream_options"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\"}]}",
     400, "missing_required_parameter", "tools[0]"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"web\"}]}", 400,
     "unsupported_parameter", "tools[0]"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"a b\"}}]}",
     400, "invalid_value", "tools[0]"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\"}}]}",
     400, "invalid_value", "tools[1]"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\","
     "\"function\":{\"name\":\"g\"}}}",
     400, "invalid_value", "tool_choice"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"tool_choice\":\"required\"}", 400,
     "invalid_value", "tool_choice"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"tool_choice\":\"sometimes\"}", 400,
     "invalid_value", "tool_choice"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\",\"parameters\":{\"type\":\"string\",\"pattern\":"
     "\"a+\"}}}],\"tool_choice\":\"required\"}",
     400, "invalid_value", "tools"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
     "{\"name\":\"f\"}}],\"tool_choice\":\"required\",\"response_format\":"
     "{\"type\":\"json_object\"}}",
     400, "invalid_value", "tool_choice"},
    {SL_SRV_CHAT,
     "{" M ",\"messages\":[{\"role\":\"assistant\",\"content\":null,"
     "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":"
     "{\"name\":7}}]}]}",
     400, "invalid_value", "messages[0]"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"type\":\"tool_result\"}]}]}",
     400, "invalid_value", "messages.0.content"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"q\"}],\"tools\":[{\"type\":\"web_search_20250305\",\"name\":"
     "\"w\"}]}",
     400, "unsupported_parameter", "tools.0"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"q\"}],\"tools\":[{\"name\":\"w\"}]}",
     400, "missing_required_parameter", "tools.0"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"q\"}],\"tool_choice\":{\"type\":\"maybe\"}}",
     400, "invalid_value", "tool_choice"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"seed\":1.5}", 400, "invalid_type",
     "seed"},
    {SL_SRV_COMPLETIONS, "{" M "}", 400, "missing_required_parameter",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":\"\"}", 400, "invalid_value",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":[]}", 400, "invalid_value",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":[1,-1]}", 400, "invalid_type",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":[1,\"a\"]}", 400, "invalid_type",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":[\"a\",\"b\"]}", 400,
     "unsupported_parameter", "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":{}}", 400, "invalid_type",
     "prompt"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":\"a\",\"echo\":true}", 400,
     "unsupported_parameter", "echo"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":\"a\",\"suffix\":\"b\"}", 400,
     "unsupported_parameter", "suffix"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":\"a\",\"logprobs\":21}", 400,
     "invalid_value", "logprobs"},
    {SL_SRV_COMPLETIONS, "{" M ",\"prompt\":\"a\",\"best_of\":3}", 400,
     "unsupported_parameter", "best_of"},
    {SL_SRV_MESSAGES, "{" M "," CHAT_MSGS "}", 400,
     "missing_required_parameter", "max_tokens"},
    {SL_SRV_MESSAGES, "{" M "," CHAT_MSGS ",\"max_tokens\":null}", 400,
     "invalid_type", "max_tokens"},
    {SL_SRV_MESSAGES, "{" M "," CHAT_MSGS ",\"max_tokens\":0}", 400,
     "invalid_value", "max_tokens"},
    {SL_SRV_MESSAGES, "{" M ",\"max_tokens\":5}", 400,
     "missing_required_parameter", "messages"},
    {SL_SRV_MESSAGES, "{" M ",\"max_tokens\":5,\"messages\":[]}", 400,
     "invalid_value", "messages"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":"
     "\"x\"}]}",
     400, "invalid_value", "messages.0"},
    {SL_SRV_MESSAGES, "{" M ",\"max_tokens\":5,\"system\":5," CHAT_MSGS "}",
     400, "invalid_type", "system"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"stop_sequences\":\"x\"}", 400,
     "invalid_type", "stop_sequences"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"temperature\":1.5}", 400,
     "invalid_value", "temperature"},
    {SL_SRV_MESSAGES, "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"top_k\":-1}",
     400, "invalid_value", "top_k"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"type\":\"image\",\"source\":{}}]}]}",
     400, "unsupported_parameter", "messages.0.content"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"thinking\":{\"type\":\"enabled\","
     "\"budget_tokens\":1000}}", /* budget_tokens must be below max_tokens */
     400, "invalid_value", "thinking"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":50," CHAT_MSGS ",\"thinking\":{\"type\":\"on\"}}",
     400, "invalid_value", "thinking"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":50," CHAT_MSGS ",\"thinking\":{\"type\":"
     "\"enabled\",\"budget_tokens\":0}}",
     400, "invalid_value", "thinking"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":50," CHAT_MSGS ",\"thinking\":{\"type\":"
     "\"enabled\"}}",
     400, "missing_required_parameter", "thinking"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"chat_template_kwargs\":[1]}", 400,
     "invalid_type", "chat_template_kwargs"},
    {SL_SRV_CHAT,
     "{" M "," CHAT_MSGS ",\"chat_template_kwargs\":{\"messages\":1}}", 400,
     "invalid_value", "chat_template_kwargs"},
    {SL_SRV_CHAT, "{" M "," CHAT_MSGS ",\"reasoning_effort\":\"max\"}", 400,
     "invalid_value", "reasoning_effort"},
    {SL_SRV_MESSAGES, "{\"model\":\"claude-3\",\"max_tokens\":5," CHAT_MSGS "}",
     404, "model_not_found", "model"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
     "\"q\"},{\"role\":\"assistant\",\"content\":\"a \"}]}",
     400, "invalid_value", "messages.1.content"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"output_config\":{\"format\":"
     "{\"type\":\"json_schema\",\"schema\":{\"type\":\"number\","
     "\"minimum\":3}}}}",
     400, "invalid_value", "output_config"},
    {SL_SRV_MESSAGES,
     "{" M ",\"max_tokens\":5," CHAT_MSGS ",\"output_config\":{\"format\":"
     "{\"type\":\"text\"}}}",
     400, "invalid_value", "output_config"},
    {SL_SRV_COUNT_TOKENS, "{" M ",\"max_tokens\":0," CHAT_MSGS "}", 400,
     "invalid_value", "max_tokens"},
    {SL_SRV_COUNT_TOKENS, "{" M "}", 400, "missing_required_parameter",
     "messages"},
};

/* Beyond the APIs' own fields (issue 12): llama.cpp's and vLLM's sampling
 * fields, logit_bias, max_tokens clamped rather than refused, prefills and
 * count_tokens without max_tokens. */
static void test_agent_fields(void) {
  sl_srv_request r;
  sl_srv_error e;
  CHECK_OK(parse(SL_SRV_CHAT,
                 "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"q\"}],\"top_k\":1,\"min_p\":0.1,"
                 "\"repetition_penalty\":1.3,\"max_tokens\":32000,"
                 "\"logit_bias\":{\"17\":-100,\"4\":2.5}}",
                 &r, &e));
  CHECK_EQ_INT(r.gen.sampling.top_k, 1);
  CHECK(r.gen.sampling.min_p == 0.1f && r.gen.sampling.repeat_penalty == 1.3f);
  CHECK(r.max_tokens_set && r.gen.max_tokens == 32000); /* clamped later */
  CHECK_EQ_INT(r.gen.n_logit_bias, 2);
  CHECK(r.gen.logit_bias == r.bias);
  int seen = 0;
  for (int i = 0; i < r.gen.n_logit_bias; i++)
    seen |= (r.bias[i].id == 17 && r.bias[i].bias == -100.0f) ? 1
            : (r.bias[i].id == 4 && r.bias[i].bias == 2.5f)   ? 2
                                                              : 4;
  CHECK_EQ_INT(seen, 3);
  CHECK(!r.continue_final);
  sl__srv_request_free(&r);

  CHECK_OK(parse(SL_SRV_CHAT,
                 "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"q\"}],\"repeat_penalty\":1.1,"
                 "\"max_tokens\":99999999999999}",
                 &r, &e));
  CHECK(r.gen.sampling.repeat_penalty == 1.1f);
  CHECK_EQ_INT(r.gen.max_tokens, INT32_MAX);
  sl__srv_request_free(&r);

  /* a last assistant message: continued on /v1/messages, and on chat when
   * continue_final_message says so */
  CHECK_OK(parse(SL_SRV_MESSAGES,
                 "{\"model\":\"default\",\"max_tokens\":5,\"messages\":"
                 "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
                 "\"assistant\",\"content\":\"1, 2,\"}]}",
                 &r, &e));
  CHECK(r.continue_final);
  sl__srv_request_free(&r);
  CHECK_OK(parse(SL_SRV_CHAT,
                 "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
                 "\"1,\"}],\"continue_final_message\":true}",
                 &r, &e));
  CHECK(r.continue_final);
  sl__srv_request_free(&r);
  CHECK_OK(parse(SL_SRV_MESSAGES,
                 "{\"model\":\"default\",\"max_tokens\":5,\"messages\":"
                 "[{\"role\":\"user\",\"content\":\"q\"}]}",
                 &r, &e));
  CHECK(!r.continue_final);
  sl__srv_request_free(&r);
  CHECK_OK(parse(SL_SRV_COUNT_TOKENS,
                 "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"q\"}]}",
                 &r, &e));
  CHECK(!r.max_tokens_set);
  sl__srv_request_free(&r);
}

/* Structured output: each way in gives the request a grammar. */
static void test_structured(void) {
  static const char *ok[][2] = {
      {"chat", ",\"response_format\":{\"type\":\"json_object\"}"},
      {"chat", ",\"response_format\":{\"type\":\"json_schema\","
               "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":"
               "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
               "\"string\",\"maxLength\":20},\"tags\":{\"type\":\"array\","
               "\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3},\"n\":"
               "{\"type\":[\"integer\",\"null\"]},\"kid\":{\"$ref\":"
               "\"#/$defs/K\"}},\"required\":[\"name\"],"
               "\"additionalProperties\":false,\"$defs\":{\"K\":{\"anyOf\":"
               "[{\"const\":1},{\"type\":\"array\",\"items\":{\"$ref\":"
               "\"#/$defs/K\"}},{\"type\":\"boolean\"}]}}}}}"},
      {"chat", ",\"grammar\":\"root ::= [a-z]+\""},
      {"chat", ",\"json_schema\":{\"type\":\"array\"}"},
      {"messages", ",\"max_tokens\":5,\"output_config\":{\"format\":{"
                   "\"type\":\"json_schema\",\"schema\":{\"type\":"
                   "\"object\",\"properties\":{\"x\":{\"type\":"
                   "\"number\"}}}}}"},
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"q\"}]%s}",
             ok[i][1]);
    sl_srv_request r;
    sl_srv_error e;
    sl_status st =
        parse(ok[i][0][0] == 'c' ? SL_SRV_CHAT : SL_SRV_MESSAGES, body, &r, &e);
    if (st != SL_OK)
      fprintf(stderr, "case %zu: %s\n", i, e.message);
    CHECK_OK(st);
    CHECK(r.grammar != NULL && r.gen.grammar == r.grammar);
    sl__srv_request_free(&r);
  }
}

/* Feeds text to a matcher of g: whether the grammar takes it whole. */
static bool grammar_takes(sl_grammar_t *g, const char *text) {
  sl_grammar_matcher_t *m = sl_grammar_matcher_create(g);
  bool ok = m && sl_grammar_matcher_accept(m, text, strlen(text)) &&
            sl_grammar_matcher_done(m);
  sl_grammar_matcher_free(m);
  return ok;
}

static const char *msg_str(const sl_srv_request *r, size_t i, const char *key) {
  return sl_jv_str(sl_jv_dict_get(sl_jv_list_get(r->messages, i), key));
}

#define WEATHER_TOOL                                                           \
  "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","             \
  "\"description\":\"d\",\"parameters\":{\"type\":\"object\","                 \
  "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":"              \
  "[\"city\"]}}}"
#define TIME_TOOL                                                              \
  "{\"type\":\"function\",\"function\":{\"name\":\"get_time\","                \
  "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}"

/* What a response_format schema's grammar takes (the JSON Schema meaning) */
static void test_schema_takes(void) {
  static const struct {
    const char *schema, *text;
    bool ok;
  } cases[] = {
      {"{\"type\":\"object\"}", "{\"a\": [1, \"x\"]}", true},
      {"{\"type\":\"object\"}", "5", false},
      {"{\"type\":\"object\"}", "\"s\"", false},
      {"{\"type\":\"object\",\"properties\":{}}", "{\"b\": 1}", true},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}",
       "{\"a\": 1}", true},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}",
       "{\"a\": \"1\"}", false},
      {"{\"type\":\"array\",\"items\":{\"type\":\"object\"}}", "[{}, {}]",
       true},
      {"{\"type\":\"array\",\"items\":{\"type\":\"object\"}}", "[1]", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"default\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"q\"}],\"json_schema\":%s}",
             cases[i].schema);
    sl_srv_request r;
    sl_srv_error e;
    CHECK_OK(parse(SL_SRV_CHAT, body, &r, &e));
    if (grammar_takes(r.grammar, cases[i].text) != cases[i].ok)
      fprintf(stderr, "case %zu: %s on %s\n", i, cases[i].schema,
              cases[i].text);
    CHECK(grammar_takes(r.grammar, cases[i].text) == cases[i].ok);
    sl__srv_request_free(&r);
  }
}

static void test_tools(void) {
  sl_srv_request r;
  sl_srv_error e;
  /* no template: the generic form, the tools in a system message */
  const char *req =
      "{\"model\":\"default\",\"messages\":[{\"role\":\"user\",\"content\":"
      "\"q\"}],\"tools\":[" WEATHER_TOOL "," TIME_TOOL
      "],\"tool_choice\":\"required\"}";
  CHECK_OK(parse(SL_SRV_CHAT, req, &r, &e));
  CHECK(r.toolfmt == SL_TOOLFMT_GENERIC &&
        r.tool_choice == SL_SRV_TOOLS_REQUIRED);
  CHECK(!r.tools_native && !r.tmpl_extra);
  CHECK(sl_jv_len(r.messages) == 2);
  CHECK(!strcmp(msg_str(&r, 0, "role"), "system"));
  CHECK(strstr(msg_str(&r, 0, "content"), "get_weather") != NULL);
  CHECK(r.grammar != NULL);
  CHECK(grammar_takes(r.grammar,
                      "{\"tool_calls\": [{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}]}"));
  CHECK(grammar_takes(r.grammar,
                      "{\"tool_calls\": [{\"name\": \"get_time\", "
                      "\"arguments\": {}}, {\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Oslo\"}}]}"));
  /* get_time lists no properties: its arguments are {} (tool schemas are
   * closed); the city is required; an unknown tool is not a call */
  CHECK(!grammar_takes(r.grammar, "{\"tool_calls\": [{\"name\": \"get_time\", "
                                  "\"arguments\": {\"x\": 1}}]}"));
  CHECK(!grammar_takes(r.grammar, "{\"tool_calls\": [{\"name\": "
                                  "\"get_weather\", \"arguments\": {}}]}"));
  CHECK(!grammar_takes(r.grammar, "{\"tool_calls\": [{\"name\": \"rm\", "
                                  "\"arguments\": {}}]}"));
  CHECK(!grammar_takes(r.grammar, "Sure!"));
  sl__srv_request_free(&r);

  /* named, no parallel calls: only that tool, once */
  req = "{\"model\":\"default\",\"messages\":[{\"role\":\"system\","
        "\"content\":\"S\"},{\"role\":\"user\",\"content\":\"q\"}],"
        "\"tools\":[" WEATHER_TOOL "," TIME_TOOL
        "],\"parallel_tool_calls\":false,\"tool_choice\":{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_time\"}}}";
  CHECK_OK(parse(SL_SRV_CHAT, req, &r, &e));
  CHECK(r.tool_choice == SL_SRV_TOOLS_NAMED &&
        !strcmp(r.tool_name, "get_time"));
  CHECK(sl_jv_len(r.messages) == 2); /* appended to the system message */
  CHECK(!strncmp(msg_str(&r, 0, "content"), "S\n\n", 3));
  CHECK(grammar_takes(r.grammar, "{\"tool_calls\": [{\"name\": \"get_time\", "
                                 "\"arguments\": {}}]}"));
  CHECK(!grammar_takes(r.grammar,
                       "{\"tool_calls\": [{\"name\": \"get_weather\", "
                       "\"arguments\": {\"city\": \"Paris\"}}]}"));
  CHECK(!grammar_takes(r.grammar,
                       "{\"tool_calls\": [{\"name\": \"get_time\", "
                       "\"arguments\": {}}, {\"name\": \"get_time\", "
                       "\"arguments\": {}}]}"));
  sl__srv_request_free(&r);

  /* a Hermes template: tools go to the template, calls stay structured */
  static const char *names[] = {"m"};
  sl_srv_limits hl = {.model_names = names,
                      .n_model_names = 1,
                      .n_ctx = 2048,
                      .chat_template =
                          "{% if tools %}{{ tools | tojson }}{% endif %}"
                          "<tool_call>",
                      .toolfmt = SL_TOOLFMT_NONE};
  req = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"q\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{"
        "\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],"
        "\"tools\":[" WEATHER_TOOL "],\"tool_choice\":\"required\"}";
  CHECK_OK(sl__srv_parse(SL_SRV_CHAT, req, strlen(req), &hl, &r, &e));
  CHECK(r.tools_native && r.tmpl_extra && r.toolfmt == SL_TOOLFMT_HERMES);
  CHECK(sl_jv_len(r.messages) == 3);
  const sl_jv *calls =
      sl_jv_dict_get(sl_jv_list_get(r.messages, 1), "tool_calls");
  CHECK(sl_jv_len(calls) == 1);
  const sl_jv *fn = sl_jv_dict_get(sl_jv_list_get(calls, 0), "function");
  CHECK(!strcmp(sl_jv_str(sl_jv_dict_get(fn, "name")), "get_weather"));
  /* arguments given as a JSON string reach the template as an object */
  CHECK(sl_jv_kind_of(sl_jv_dict_get(fn, "arguments")) == SL_JV_DICT);
  CHECK(!strcmp(msg_str(&r, 2, "tool_call_id"), "c1"));
  CHECK(grammar_takes(r.grammar, "<tool_call>\n{\"name\": \"get_weather\", "
                                 "\"arguments\": {\"city\": \"Rome\"}}\n"
                                 "</tool_call>"));
  CHECK(!grammar_takes(r.grammar, "{\"name\": \"get_weather\", \"arguments\": "
                                  "{\"city\": \"Rome\"}}"));
  sl__srv_request_free(&r);

  /* Anthropic: tool_use and tool_result blocks, tool_choice any */
  req =
      "{\"model\":\"m\",\"max_tokens\":9,\"system\":\"S\",\"messages\":["
      "{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
      "\"content\":[{\"type\":\"text\",\"text\":\"Let me look.\"},{\"type\":"
      "\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":"
      "{\"city\":\"Rome\"}}]},{\"role\":\"user\",\"content\":[{\"type\":"
      "\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":"
      "\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"and?\"}]}],"
      "\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":"
      "\"object\"}}],\"tool_choice\":{\"type\":\"any\","
      "\"disable_parallel_tool_use\":true}}";
  CHECK_OK(sl__srv_parse(SL_SRV_MESSAGES, req, strlen(req), &hl, &r, &e));
  CHECK(r.tool_choice == SL_SRV_TOOLS_REQUIRED && !r.tools_parallel);
  CHECK(sl_jv_len(r.messages) == 5); /* system, user, assistant, tool, user */
  CHECK(!strcmp(msg_str(&r, 2, "content"), "Let me look."));
  CHECK(sl_jv_len(
            sl_jv_dict_get(sl_jv_list_get(r.messages, 2), "tool_calls")) == 1);
  CHECK(!strcmp(msg_str(&r, 3, "role"), "tool") &&
        !strcmp(msg_str(&r, 3, "content"), "sunny") &&
        !strcmp(msg_str(&r, 3, "tool_call_id"), "toolu_1"));
  CHECK(!strcmp(msg_str(&r, 4, "content"), "and?"));
  CHECK(!grammar_takes(r.grammar,
                       "<tool_call>\n{\"name\": \"get_weather\", "
                       "\"arguments\": {}}\n</tool_call>\n<tool_call>\n{"
                       "\"name\": \"get_weather\", \"arguments\": {}}\n"
                       "</tool_call>"));
  sl__srv_request_free(&r);

  /* without a template that renders them, earlier calls are the JSON the
   * model is asked to write */
  req = "{\"model\":\"default\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_time\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
        "\"content\":\"noon\"}],\"tools\":[" TIME_TOOL "]}";
  CHECK_OK(parse(SL_SRV_CHAT, req, &r, &e));
  CHECK(r.tool_choice == SL_SRV_TOOLS_AUTO && !r.grammar);
  CHECK(!strcmp(msg_str(&r, 2, "content"),
                "{\"tool_calls\":[{\"name\":\"get_time\",\"arguments\":{}}]}"));
  sl__srv_request_free(&r);

  /* tool_choice none: the answer is text, whatever it looks like */
  req = "{\"model\":\"default\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"q\"}],\"tools\":[" TIME_TOOL "],\"tool_choice\":\"none\"}";
  CHECK_OK(parse(SL_SRV_CHAT, req, &r, &e));
  CHECK(r.toolfmt == SL_TOOLFMT_NONE && sl_jv_len(r.messages) == 1);
  sl__srv_request_free(&r);
}

static void test_bad_inputs(void) {
  size_t live = sl_malloc_live_bytes();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const bad_case *b = &bad[i];
    sl_srv_request r;
    sl_srv_error e;
    sl_status st = parse(b->api, b->body, &r, &e);
    CHECK_MSG(st != SL_OK, "case %zu accepted: %s", i, b->body);
    if (st == SL_OK) {
      sl__srv_request_free(&r);
      continue;
    }
    CHECK_MSG(e.http == b->http, "case %zu: http %d, want %d (%s)", i, e.http,
              b->http, e.message);
    if (b->code)
      CHECK_MSG(strcmp(e.code, b->code) == 0,
                "case %zu: code '%s', want '%s'"
                " (%s)",
                i, e.code, b->code, e.message);
    if (b->param)
      CHECK_MSG(strcmp(e.param, b->param) == 0,
                "case %zu: param '%s', want '%s'", i, e.param, b->param);
    CHECK_MSG(e.message[0] != 0, "case %zu: no message", i);
    CHECK(r.messages == NULL && r.model == NULL && r.prompt == NULL);
  }
  CHECK_EQ_INT(sl_malloc_live_bytes(), live);
}

static void test_error_shapes(void) {
  sl_srv_error e;
  sl__srv_error_set(&e, 400, "invalid_value", "max_tokens", "bad %d", 7);
  json_t *o = sl__srv_error_json(SL_SRV_FAMILY_OPENAI, &e);
  json_t *err = json_object_get(o, "error");
  CHECK(json_is_object(err));
  CHECK(strcmp(json_string_value(json_object_get(err, "message")), "bad 7") ==
        0);
  CHECK(strcmp(json_string_value(json_object_get(err, "type")),
               "invalid_request_error") == 0);
  CHECK(strcmp(json_string_value(json_object_get(err, "param")),
               "max_tokens") == 0);
  CHECK(strcmp(json_string_value(json_object_get(err, "code")),
               "invalid_value") == 0);
  CHECK(json_object_get(err, "estimated_bytes") == NULL);
  json_decref(o);

  sl__srv_error_set(&e, 400, "prefill_memory_exceeded", NULL, "too big");
  e.est_bytes = 1000;
  e.limit_bytes = 10;
  o = sl__srv_error_json(SL_SRV_FAMILY_OPENAI, &e);
  err = json_object_get(o, "error");
  CHECK(json_is_null(json_object_get(err, "param")));
  CHECK(json_integer_value(json_object_get(err, "estimated_bytes")) == 1000);
  CHECK(json_integer_value(json_object_get(err, "limit_bytes")) == 10);
  json_decref(o);

  sl__srv_error_set(&e, 500, NULL, NULL, "boom");
  o = sl__srv_error_json(SL_SRV_FAMILY_OPENAI, &e);
  err = json_object_get(o, "error");
  CHECK(strcmp(json_string_value(json_object_get(err, "type")),
               "server_error") == 0);
  CHECK(json_is_null(json_object_get(err, "code")));
  json_decref(o);

  static const struct {
    int http;
    const char *type;
  } ant[] = {{400, "invalid_request_error"},
             {401, "authentication_error"},
             {404, "not_found_error"},
             {413, "request_too_large"},
             {500, "api_error"},
             {503, "overloaded_error"}};
  for (size_t i = 0; i < sizeof ant / sizeof ant[0]; i++) {
    sl__srv_error_set(&e, ant[i].http, "x", NULL, "m\xff"); /* lossy */
    o = sl__srv_error_json(SL_SRV_FAMILY_ANTHROPIC, &e);
    CHECK(strcmp(json_string_value(json_object_get(o, "type")), "error") == 0);
    err = json_object_get(o, "error");
    CHECK(strcmp(json_string_value(json_object_get(err, "type")),
                 ant[i].type) == 0);
    CHECK(strcmp(json_string_value(json_object_get(err, "message")),
                 "m\xEF\xBF\xBD") == 0);
    CHECK_EQ_INT(json_object_size(err), 2);
    json_decref(o);
  }
}

static void test_utf8(void) {
  CHECK(sl__utf8_valid("", 0));
  CHECK(sl__utf8_valid("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
  CHECK(!sl__utf8_valid("\xc0\x80", 2));         /* overlong NUL */
  CHECK(!sl__utf8_valid("\xe0\x80\xaf", 3));     /* overlong / */
  CHECK(!sl__utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
  CHECK(!sl__utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
  CHECK(!sl__utf8_valid("\xe2\x82", 2));         /* truncated */
  CHECK(!sl__utf8_valid("\x80", 1));
  CHECK(!sl__utf8_valid("\xf8\x88\x80\x80\x80", 5));
  CHECK(sl__utf8_valid("\xf4\x8f\xbf\xbf", 4));
  CHECK_EQ_INT(sl__utf8_valid_prefix("ab\xe2\x82", 4), 2);
  CHECK_EQ_INT(sl__utf8_valid_prefix("ab\xe2\x82\xac", 5), 5);
  json_t *s = sl__json_str_lossy("a\xff"
                                 "b",
                                 3);
  CHECK(s && strcmp(json_string_value(s), "a\xEF\xBF\xBD"
                                          "b") == 0);
  json_decref(s);
}

/* Fails the Nth allocation for every N the parse makes: each attempt ends in
 * SL_OK or a 500 out-of-memory error, and nothing leaks. */
static void test_alloc_failures(void) {
  const char *bodies[] = {
      "{" M ",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}],"
      "\"stop\":[\"x\",\"y\"],\"logprobs\":true}",
      "{" M ",\"prompt\":[1,2,3],\"stop\":\"z\"}",
      "{" M ",\"max_tokens\":4,\"system\":\"s\",\"messages\":[{\"role\":"
      "\"user\",\"content\":\"q\"}],\"stop_sequences\":[\"k\"]}",
      /* tools: calls and results in the conversation, a forced call */
      "{" M ",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
      "\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":"
      "\"{\\\"tz\\\":\\\"utc\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
      "\"c1\",\"content\":\"noon\"}],\"tools\":[" TIME_TOOL
      "],\"tool_choice\":\"required\"}",
      "{" M ",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
      "\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
      "\"text\":\"a\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
      "\"w\",\"input\":{\"c\":1}}]},{\"role\":\"user\",\"content\":[{"
      "\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"ok\"}]}],"
      "\"tools\":[{\"name\":\"w\",\"input_schema\":{\"type\":\"object\"}}]}",
      "{" M ",\"input\":[\"a\",[1,2]]}"};
  const sl_srv_api apis[] = {SL_SRV_CHAT,     SL_SRV_COMPLETIONS,
                             SL_SRV_MESSAGES, SL_SRV_CHAT,
                             SL_SRV_MESSAGES, SL_SRV_EMBEDDINGS};
  for (int b = 0; b < 6; b++) {
    int ok_at = -1;
    for (int n = 1; n < 3000 && ok_at < 0; n++) {
      size_t live = sl_malloc_live_bytes();
      sl_srv_request r;
      sl_srv_error e;
      sl_malloc_fail_after((uint64_t)n);
      sl_status st = parse(apis[b], bodies[b], &r, &e);
      sl_malloc_fail_after(0);
      if (st == SL_OK) {
        ok_at = n;
        sl__srv_request_free(&r);
      } else {
        /* an allocation failure is the server's fault, never the client's */
        CHECK_MSG(e.http == 500 || e.http == 503, "body %d n %d: http %d (%s)",
                  b, n, e.http, e.message);
      }
      CHECK_MSG(sl_malloc_live_bytes() == live, "body %d n %d leaks %zu", b, n,
                sl_malloc_live_bytes() - live);
    }
    CHECK_MSG(ok_at > 1, "body %d never needed an allocation or never passed",
              b);
  }
}

int main(void) {
  sl__srv_json_init();
  RUN(test_chat_ok);
  RUN(test_completions_ok);
  RUN(test_messages_ok);
  RUN(test_agent_fields);
  RUN(test_structured);
  RUN(test_schema_takes);
  RUN(test_tools);
  RUN(test_bad_inputs);
  RUN(test_error_shapes);
  RUN(test_utf8);
  RUN(test_alloc_failures);
  return sl_test_finish();
}
