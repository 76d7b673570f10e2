"""The router's HTTP routes, thin: the OpenAI API (``openai``) and the launcher's admin
API (``admin``) over admission (``router.admission``) and the proxy (``router.proxy``);
``http`` holds what they share (body reading, JSON and OpenAI error responses)."""
