"""Published model shapes the benchmarks build with random weights (transformers config keyword arguments)."""

LLAMA_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, tie_word_embeddings=True)
SMOLLM2 = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True)
