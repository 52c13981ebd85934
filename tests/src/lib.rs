pub mod mock_provider;
